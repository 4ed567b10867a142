// dtensor/parallel/pipeline/action.hpp — one step of a pipeline schedule, in PyTorch's notation.
//
//   auto a = pipeline::parse_action("1RECV_F0");   // {stage 1, recv_forward, micro-batch 0}
//   pipeline::to_string(a) == "1RECV_F0";
//
// An action is [stage][kind][micro-batch], exactly as torch.distributed.pipelining writes its
// _Action: `0F0` forward of micro-batch 0 on stage 0, `1B0` full backward, `1I0` backward with
// respect to the input only, `2W1` backward with respect to the weights only, `0SEND_F0` stage 0
// sends its forward output of micro-batch 0 (received by `1RECV_F0`), `1SEND_B0` stage 1 sends the
// gradient of its input (received by `0RECV_B0`). A send names the sending stage, a receive the
// receiving stage, so a matching pair differs by one in the stage. Reading and writing the same
// text keeps schedules exchangeable with PyTorch's CSV files.
#pragma once

#include <array>
#include <charconv>
#include <compare>
#include <optional>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"

namespace dtensor::parallel::pipeline {

enum class ActionKind {
  forward,          // F
  backward,         // B: input and weight gradients together
  backward_input,   // I: gradient of the stage input only (zero-bubble schedules)
  backward_weight,  // W: gradient of the weights, after the I of the same micro-batch
  send_forward,     // SEND_F
  recv_forward,     // RECV_F
  send_backward,    // SEND_B
  recv_backward,    // RECV_B
};

struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::forward;
  int microbatch = 0;

  friend auto operator<=>(const Action&, const Action&) = default;
};

/// The kind's text in PyTorch's notation ("F", "SEND_B", ...).
inline std::string_view kind_symbol(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward: return "F";
    case ActionKind::backward: return "B";
    case ActionKind::backward_input: return "I";
    case ActionKind::backward_weight: return "W";
    case ActionKind::send_forward: return "SEND_F";
    case ActionKind::recv_forward: return "RECV_F";
    case ActionKind::send_backward: return "SEND_B";
    case ActionKind::recv_backward: return "RECV_B";
  }
  return "?";
}

inline bool is_compute(ActionKind kind) {
  return kind == ActionKind::forward || kind == ActionKind::backward || kind == ActionKind::backward_input ||
         kind == ActionKind::backward_weight;
}
inline bool is_send(ActionKind kind) { return kind == ActionKind::send_forward || kind == ActionKind::send_backward; }
inline bool is_recv(ActionKind kind) { return kind == ActionKind::recv_forward || kind == ActionKind::recv_backward; }
/// B and I both produce the gradient of the stage input (what the previous stage waits for).
inline bool makes_input_gradient(ActionKind kind) {
  return kind == ActionKind::backward || kind == ActionKind::backward_input;
}

inline std::string to_string(const Action& action) {
  return dtensor::detail::cat(action.stage, kind_symbol(action.kind), action.microbatch);
}

/// The other half of a send or a receive: `0SEND_F3` <-> `1RECV_F3`, `2SEND_B1` <-> `1RECV_B1`.
inline Action counterpart(const Action& action) {
  switch (action.kind) {
    case ActionKind::send_forward: return {action.stage + 1, ActionKind::recv_forward, action.microbatch};
    case ActionKind::recv_forward: return {action.stage - 1, ActionKind::send_forward, action.microbatch};
    case ActionKind::send_backward: return {action.stage - 1, ActionKind::recv_backward, action.microbatch};
    case ActionKind::recv_backward: return {action.stage + 1, ActionKind::send_backward, action.microbatch};
    default: break;
  }
  throw Error("pipeline::counterpart", dtensor::detail::cat(to_string(action), " is a computation, not a send or a receive"));
}

/// The action a string names, or nothing when it is not one: digits, a kind, digits, no more.
inline std::optional<Action> try_parse_action(std::string_view text) {
  const char* const end = text.data() + text.size();
  Action action;
  auto stage_end = std::from_chars(text.data(), end, action.stage);
  if (stage_end.ec != std::errc{} || text.empty() || text.front() == '-') return std::nullopt;
  std::string_view rest(stage_end.ptr, std::size_t(end - stage_end.ptr));
  // No symbol is a prefix of another, so the first one that matches is the only one.
  static constexpr std::array kinds{ActionKind::forward,        ActionKind::backward,
                                    ActionKind::backward_input, ActionKind::backward_weight,
                                    ActionKind::send_forward,   ActionKind::recv_forward,
                                    ActionKind::send_backward,  ActionKind::recv_backward};
  for (ActionKind kind : kinds) {
    const std::string_view symbol = kind_symbol(kind);
    if (!rest.starts_with(symbol)) continue;
    const std::string_view digits = rest.substr(symbol.size());
    if (digits.empty() || digits.front() == '-' || digits.front() == '+') return std::nullopt;
    auto mb_end = std::from_chars(digits.data(), digits.data() + digits.size(), action.microbatch);
    if (mb_end.ec != std::errc{} || mb_end.ptr != digits.data() + digits.size()) return std::nullopt;
    action.kind = kind;
    return action;
  }
  return std::nullopt;
}

/// Parses an action; text that is not one is a dtensor::Error quoting it.
inline Action parse_action(std::string_view text) {
  if (auto action = try_parse_action(text)) return *action;
  throw Error("pipeline::parse_action",
              dtensor::detail::cat("'", text, "' is not an action: expected [stage][F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B]",
                          "[micro-batch], e.g. 0F0, 1RECV_B3"));
}

}  // namespace dtensor::parallel::pipeline
