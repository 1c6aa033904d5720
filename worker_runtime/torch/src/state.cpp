// Module and optimizer state <-> ddprun Checkpoint sections (see state.h for the names).
#include "ddprun/worker/torch/state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <typeinfo>

#include "ddprun/worker/torch/ddp.h"

namespace ddprun::worker::libtorch {

namespace {

void put_tensor(Checkpoint& ckpt, const std::string& name, const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  ckpt.put(name, c.data_ptr(), c.nbytes());
}

// Into an existing tensor (any device); the section's size must match.
void get_tensor(const Checkpoint& ckpt, const std::string& name, const at::Tensor& dst) {
  at::NoGradGuard ng;
  at::Tensor c = at::empty(dst.sizes(), dst.options().device(at::kCPU).requires_grad(false));
  ckpt.get_into(name, c.data_ptr(), c.nbytes());
  dst.copy_(c);
}

at::Tensor get_like(const Checkpoint& ckpt, const std::string& name, const at::Tensor& like) {
  at::Tensor t = at::empty_like(like, at::MemoryFormat::Contiguous);
  get_tensor(ckpt, name, t);
  return t;
}

// Optimizer state keys are the parameters' TensorImpl pointers: map them to module paths.
std::vector<std::pair<std::string, at::Tensor>> named_params(const ::torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(true)) out.emplace_back(item.key(), item.value());
  return out;
}

void check_covered(const ::torch::optim::Optimizer& opt, const ::torch::nn::Module& module) {
  std::unordered_set<const void*> known;
  for (const auto& item : module.named_parameters(true)) known.insert(item.value().unsafeGetTensorImpl());
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params())
      if (!known.count(p.unsafeGetTensorImpl()))
        throw DdpError("checkpoint: the optimizer updates a parameter that is not in the module given; pass the "
                       "module whose parameters() the optimizer was built from");
}

// "torch::optim::RMSprop", not "N5torch5optim7RMSpropE".
std::string readable_type(const std::type_info& t) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(t.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(t.name());
}

bool has_named_sections(const ::torch::optim::Optimizer& opt) {
  return dynamic_cast<const ::torch::optim::SGD*>(&opt) || dynamic_cast<const ::torch::optim::Adam*>(&opt) ||
         dynamic_cast<const ::torch::optim::AdamW*>(&opt);
}

// Any other optimizer: its own LibTorch serialization (Optimizer::save/load: the state of every
// parameter by its place in the param groups, and the groups' options) in one section.
void save_archive(const ::torch::optim::Optimizer& opt, Checkpoint& ckpt, const std::string& name) {
  ::torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  std::string s = std::move(bytes).str();
  // Optimizer::save of the base class writes nothing: an optimizer of the user's own that does
  // not override it would resume with its state silently reset.
  if (!opt.state().empty()) {
    std::istringstream in(s);
    ::torch::serialize::InputArchive check;
    check.load_from(in);
    if (check.keys().empty())
      throw DdpError("checkpoint: optimizer " + readable_type(typeid(opt)) +
                     " saves nothing through torch::optim::Optimizer::save; override save() and load() (as "
                     "LibTorch's own optimizers do), or save its state yourself with Checkpoint::put");
  }
  ckpt.put(name, s.data(), s.size());
  const std::string type = readable_type(typeid(opt));
  ckpt.put(name + "_type", type.data(), type.size());
}

void load_archive(::torch::optim::Optimizer& opt, const Checkpoint& ckpt, const std::string& name) {
  const std::string type = readable_type(typeid(opt));
  const std::string saved = ckpt.has(name + "_type") ? ckpt.section(name + "_type") : "an unnamed optimizer";
  if (saved != type)
    throw DdpError("checkpoint: it holds the state of " + saved + ", and the optimizer to load is " + type +
                   "; resume with the optimizer that saved it");
  try {
    std::istringstream in(ckpt.section(name));
    ::torch::serialize::InputArchive archive;
    archive.load_from(in);
    opt.load(archive);
  } catch (const c10::Error& e) {
    throw DdpError("checkpoint: the state of " + type + " in section '" + name +
                   "' does not fit this optimizer (its parameter groups differ?): " + e.what_without_backtrace());
  }
}

}  // namespace

void save_module(const ::torch::nn::Module& module, Checkpoint& ckpt, const std::string& prefix) {
  for (const auto& item : module.named_parameters(true)) put_tensor(ckpt, prefix + "param/" + item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) put_tensor(ckpt, prefix + "buffer/" + item.key(), item.value());
}

void load_module(::torch::nn::Module& module, const Checkpoint& ckpt, const std::string& prefix) {
  for (const auto& item : module.named_parameters(true)) get_tensor(ckpt, prefix + "param/" + item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) get_tensor(ckpt, prefix + "buffer/" + item.key(), item.value());
}

void save_optimizer(const ::torch::optim::Optimizer& opt, const ::torch::nn::Module& module, Checkpoint& ckpt,
                    const std::string& prefix) {
  check_covered(opt, module);
  if (!has_named_sections(opt)) return save_archive(opt, ckpt, prefix + "optim/torch_archive");
  const auto& state = opt.state();
  for (const auto& [name, p] : named_params(module)) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    const std::string base = prefix + "optim/" + name + "/";
    const auto* st = it->second.get();
    if (const auto* sgd = dynamic_cast<const ::torch::optim::SGDParamState*>(st)) {
      if (sgd->momentum_buffer().defined()) put_tensor(ckpt, base + "momentum_buffer", sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const ::torch::optim::AdamParamState*>(st)) {
      ckpt.put_u64(base + "step", static_cast<uint64_t>(adam->step()));
      put_tensor(ckpt, base + "exp_avg", adam->exp_avg());
      put_tensor(ckpt, base + "exp_avg_sq", adam->exp_avg_sq());
      if (adam->max_exp_avg_sq().defined()) put_tensor(ckpt, base + "max_exp_avg_sq", adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const ::torch::optim::AdamWParamState*>(st)) {
      ckpt.put_u64(base + "step", static_cast<uint64_t>(adamw->step()));
      put_tensor(ckpt, base + "exp_avg", adamw->exp_avg());
      put_tensor(ckpt, base + "exp_avg_sq", adamw->exp_avg_sq());
      if (adamw->max_exp_avg_sq().defined()) put_tensor(ckpt, base + "max_exp_avg_sq", adamw->max_exp_avg_sq());
    } else {
      throw DdpError("checkpoint: optimizer state of type " + readable_type(typeid(*st)) + " under optimizer " +
                     readable_type(typeid(opt)) + " is not SGD's, Adam's or AdamW's");
    }
  }
}

void load_optimizer(::torch::optim::Optimizer& opt, const ::torch::nn::Module& module, const Checkpoint& ckpt,
                    const std::string& prefix) {
  check_covered(opt, module);
  const bool is_sgd = dynamic_cast<const ::torch::optim::SGD*>(&opt) != nullptr;
  const bool is_adam = dynamic_cast<const ::torch::optim::Adam*>(&opt) != nullptr;
  const bool is_adamw = dynamic_cast<const ::torch::optim::AdamW*>(&opt) != nullptr;
  if (!is_sgd && !is_adam && !is_adamw) {
    const std::string name = prefix + "optim/torch_archive";
    if (ckpt.has(name)) return load_archive(opt, ckpt, name);
    if (std::any_of(ckpt.sections.begin(), ckpt.sections.end(),
                    [&](const auto& s) { return s.first.rfind(prefix + "optim/", 0) == 0; }))
      throw DdpError("checkpoint: the checkpoint holds SGD/Adam/AdamW state, not state of " +
                     readable_type(typeid(opt)) + "; resume with the optimizer that saved it");
    return;  // saved before any step: no state
  }
  if (ckpt.has(prefix + "optim/torch_archive"))
    throw DdpError("checkpoint: the checkpoint holds the state of another optimizer than " +
                   readable_type(typeid(opt)) + "; resume with the optimizer that saved it");
  auto& state = opt.state();
  for (const auto& [name, p] : named_params(module)) {
    const std::string base = prefix + "optim/" + name + "/";
    void* key = p.unsafeGetTensorImpl();
    state.erase(key);
    if (is_sgd) {
      if (!ckpt.has(base + "momentum_buffer")) continue;
      auto st = std::make_unique<::torch::optim::SGDParamState>();
      st->momentum_buffer(get_like(ckpt, base + "momentum_buffer", p));
      state[key] = std::move(st);
    } else {
      if (!ckpt.has(base + "step")) continue;
      auto fill = [&](auto st) {
        st->step(static_cast<int64_t>(ckpt.get_u64(base + "step")));
        st->exp_avg(get_like(ckpt, base + "exp_avg", p));
        st->exp_avg_sq(get_like(ckpt, base + "exp_avg_sq", p));
        if (ckpt.has(base + "max_exp_avg_sq")) st->max_exp_avg_sq(get_like(ckpt, base + "max_exp_avg_sq", p));
        state[key] = std::move(st);
      };
      if (is_adam) fill(std::make_unique<::torch::optim::AdamParamState>());
      else fill(std::make_unique<::torch::optim::AdamWParamState>());
    }
  }
}

uint64_t state_checksum(const ::torch::nn::Module& module, StateParts parts) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  auto add = [&](const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t k = 0; k < c.nbytes(); ++k) h = (h ^ b[k]) * 0x100000001b3ull;
  };
  for (const auto& item : module.named_parameters(true)) add(item.value());
  if (parts == StateParts::ParametersAndBuffers)
    for (const auto& item : module.named_buffers(true)) add(item.value());
  return h;
}

}  // namespace ddprun::worker::libtorch
