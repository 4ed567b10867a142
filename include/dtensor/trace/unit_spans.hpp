// dtensor/trace/unit_spans.hpp — compute spans per model unit, through the model's unit hooks.
//
//   parallel::DataParallel<Mesh> ddp(mesh);  ddp.attach(model);    // the wrappers first ...
//   trace::trace_units(model);                                     // ... then this, which keeps their hooks
//
// A model with units() and hooks()/set_hooks(nn::UnitHooks) (models::GPT and the models built like
// it) announces each unit's forward and backward to its hooks. trace_units wraps the hooks it
// finds so that, inside a trace scope, each unit's forward is a span "forward <unit>" (from
// after the unit's pre_forward hook to before its post_forward hook: the compute, not FSDP's
// gather or reshard) and each unit's backward a span "backward <unit>" (from after its
// pre_backward hook to the next pre_backward or grads_ready: with the split backward of a
// pipeline schedule, the input-gradient part). Outside a scope the wrappers only check for one.
// A wrapper that sets hooks after trace_units replaces these (set_hooks replaces them all).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "dtensor/trace/rank_trace.hpp"

namespace dtensor::trace {

namespace detail {
/// The backward span a model's hooks have open, on which track.
struct OpenUnitSpan {
  RankTrace* trace = nullptr;
  std::size_t depth = 0;

  void close() {
    if (trace != nullptr && trace == active_trace() && trace->depth() > depth) trace->close(depth);
    trace = nullptr;
  }
};
}  // namespace detail

template <class Model>
void trace_units(Model& model) {
  auto hooks = model.hooks();
  auto open_backward = std::make_shared<detail::OpenUnitSpan>();
  auto open_forward = std::make_shared<detail::OpenUnitSpan>();
  auto unit_name = [&model](std::size_t unit) {
    const auto& units = model.units();
    return unit < units.size() ? units[unit].group->name() : "unit " + std::to_string(unit);
  };
  auto open = [unit_name](detail::OpenUnitSpan& span, const char* what, std::size_t unit) {
    RankTrace* t = detail::active_trace();
    if (t == nullptr) [[likely]]
      return;
    span.trace = t;
    span.depth = t->open(std::string(what) + " " + unit_name(unit));
  };
  auto call = [](const std::function<void(std::size_t)>& hook, std::size_t unit) {
    if (hook) hook(unit);
  };
  decltype(hooks) traced;
  traced.pre_forward = [=, inner = hooks.pre_forward](std::size_t unit) {
    call(inner, unit);
    open(*open_forward, "forward", unit);
  };
  traced.post_forward = [=, inner = hooks.post_forward](std::size_t unit) {
    open_forward->close();
    call(inner, unit);
  };
  traced.pre_backward = [=, inner = hooks.pre_backward](std::size_t unit) {
    open_backward->close();
    call(inner, unit);
    open(*open_backward, "backward", unit);
  };
  traced.grads_ready = [=, inner = hooks.grads_ready](std::size_t unit) {
    open_backward->close();
    call(inner, unit);
  };
  model.set_hooks(std::move(traced));
}

}  // namespace dtensor::trace
