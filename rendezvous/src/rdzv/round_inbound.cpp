// A message from an agent: decoded to its typed form (RoundState::decode, outside a server's
// lock) and applied to the rounds (RoundState::on_inbound).
#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"
#include "round_state_detail.h"

namespace ddprun::rdzv {

using namespace detail;

RoundState::Inbound RoundState::decode(const Message& m) {
  Inbound in{.type = m.type, .body = {}};
  switch (m.type) {
    case MsgType::Join: in.body = from_message<Join>(m); break;
    case MsgType::StatusQuery: in.body = from_message<StatusQuery>(m); break;
    case MsgType::Heartbeat: in.body = from_message<Heartbeat>(m); break;
    case MsgType::Failure: in.body = sanitized(from_message<Failure>(m)); break;
    case MsgType::Succeeded: in.body = from_message<Succeeded>(m); break;
    case MsgType::Progress: in.body = from_message<Progress>(m); break;
    default: break;  // LEAVE has no fields; anything else is answered with an error
  }
  return in;
}

void RoundState::on_inbound(ConnId conn, Inbound m, Clock::time_point now, std::vector<Outbound>& out) {
  if (m.type == MsgType::Join) {
    on_join(conn, std::get<Join>(m.body), now, out);
    return;
  }
  if (m.type == MsgType::StatusQuery) {  // from any connection: `ddprun status` joins nothing
    on_status_query(conn, std::get<StatusQuery>(m.body), out);
    return;
  }
  auto cj = conn_job_.find(conn);
  if (cj == conn_job_.end()) {
    if (dropped_.count(conn)) return;  // told why already; its connection is closing
    out.push_back({conn, error_msg(std::string(msg_type_name(m.type)) + " before JOIN"), true});
    return;
  }
  Job& job = jobs_.at(cj->second);
  job.members.at(conn).last_seen = now;
  switch (m.type) {
    case MsgType::Heartbeat:
      if (auto& status = std::get<Heartbeat>(m.body).status; !status.empty() && status.size() <= kMaxStatusBytes)
        job.members.at(conn).status = std::move(status);
      break;
    case MsgType::Failure: on_failure(job, conn, std::get<Failure>(m.body), out); break;
    case MsgType::Succeeded: on_succeeded(job, conn, std::get<Succeeded>(m.body), out); break;
    case MsgType::Progress: on_progress(job, conn, std::get<Progress>(m.body)); break;
    case MsgType::Leave: on_disconnect(conn, now, out); break;
    default: out.push_back({conn, error_msg(std::string("unexpected message ") + msg_type_name(m.type)), true});
  }
}

}  // namespace ddprun::rdzv
