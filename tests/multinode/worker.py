"""A stand-in worker for the multi-node tests: records what it was given, then behaves as the
DDPT_* variables say. Only the standard library, so it starts fast."""
import json
import os
import sys
import time

env = os.environ
rec = {k: env.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                               "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
                               "TORCHELASTIC_RUN_ID", "DDPT_NODE", "GLOO_SOCKET_IFNAME")}
rec["pid"] = os.getpid()
rec["t"] = time.time()
line = json.dumps(rec) + "\n"
fd = os.open(os.path.join(env["DDPT_OUT"], "records.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)

print(f"worker rank {env.get('RANK')} of world {env.get('WORLD_SIZE')} started", flush=True)

attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
fail = env.get("DDPT_FAIL")  # node:local_rank:attempt:exit_code
if fail:
    node, lr, att, code = fail.split(":")
    if node == env.get("DDPT_NODE") and lr == env.get("LOCAL_RANK") and int(att) == attempt:
        time.sleep(float(env.get("DDPT_FAIL_AFTER", "0.3")))
        print(f"worker rank {env.get('RANK')} failing on purpose with {code}", file=sys.stderr, flush=True)
        sys.exit(int(code))

# Run until the release file exists (the test holds workers in place), bounded.
release = env.get("DDPT_RELEASE")
limit = time.monotonic() + float(env.get("DDPT_MAX_SECONDS", "60"))
run_for = float(env.get("DDPT_RUN_SECONDS", "0"))
end = time.monotonic() + run_for
while time.monotonic() < limit:
    if release and os.path.exists(release) and time.monotonic() >= end:
        break
    if not release and time.monotonic() >= end:
        break
    time.sleep(0.05)
else:
    print("worker hit DDPT_MAX_SECONDS", file=sys.stderr)
    sys.exit(7)
