// dtensor/models/hf_checkpoint.hpp — Hugging Face GPT-2 and Llama checkpoints (safetensors, by
// their HF tensor names) into models::GPT / models::Llama, and back.
//
//   models::GPT<float, Mesh> model(mesh, {.vocab = 50257, .seq = 1024, .dim = 768, .heads = 12, .layers = 12});
//   models::import_hf_safetensors("gpt2/model.safetensors", model, models::HfArch::gpt2);
//   models::export_hf_safetensors("out/model.safetensors", model, models::HfArch::llama);   // a Llama
//
// The name map (hf_name_map): for every dtensor parameter, the HF tensors it is made of and which
// row of which one each of its rows is (weights as [out, in] rows; vectors as rows of one):
//   GPT-2 ("transformer." prefix optional on import): wte, wpe (the first cfg.seq rows of a
//   longer table), h.N.ln_1/ln_2 -> h.N.ln1/ln2, ln_f; attn.c_attn [C, 3C] is a Conv1D (x W + b:
//   [in, out], transposed here) whose columns are all q heads, all k, all v: dtensor's qkv rows
//   are per head (q, k, v of head h at rows [3hD, 3(h+1)D), nn/attention.hpp), so its rows are
//   c_attn's columns regrouped; attn.c_proj, mlp.c_fc, mlp.c_proj are Conv1Ds (transposed) to
//   attn.proj, mlp.fc1, mlp.fc2. lm_head.weight if the file has it, else wte (GPT-2 ties them).
//   Llama ("model." prefix): embed_tokens -> wte; input_layernorm / post_attention_layernorm ->
//   ln1 / ln2; self_attn.q_proj [HD, C], k_proj, v_proj [KD, C] -> qkv, grouped by KV head g:
//   its G = H/K query heads, then k head g, then v head g; o_proj -> attn.proj; mlp.gate_proj and
//   up_proj [F, C] -> mlp.w13 with alternating rows (2j gate j, 2j+1 up j, nn/swiglu.hpp);
//   down_proj -> w2; model.norm -> ln_f; lm_head (else embed_tokens: tie_word_embeddings). The
//   rotary layout needs no permutation: ops::rotary pairs features (i, i + D/2) as HF's
//   rotate_half does. config.json: models::hf_config reads it into a GPTConfig (sizes, eps,
//   rope_theta, llama3 rope scaling: Llama 3.1/3.2's, core/rope.hpp); the import reads the one
//   next to the checkpoint and refuses, naming the field and both values, what differs from the
//   model, and what it cannot express: attention_bias or mlp_bias true, another activation,
//   rope types other than default and llama3 (linear, dynamic, yarn, ...); and any tensor of the
//   checkpoint no parameter reads (a bias, a layer more than the model's). GPT-2's activation is
//   gelu_new, which ops::gelu is. Checksums: a file this library wrote carries one per tensor
//   (checkpoint/safetensors_format.hpp); the import verifies them, files from elsewhere have none.
// Import: every rank reads only the byte ranges of its own boxes (checkpoint::parameter_slots:
// any mesh, any layout). A box's rows are cut into runs whose map rows are consecutive rows of
// one source; each run is one box of that source ([rows, the box's columns], or for a Conv1D
// source [the box's columns, rows]: a Shard<0> run of a row-major tensor is one contiguous range,
// a Shard<1> or transposed run a strided set, read by safetensors::read_box run by run), so a
// rank reads its parameters' elements once each, plus the headers and index it needs
// (safetensors::bytes_read counts them; test_llama checks the count on 4 and 8 ranks). F32/F64/
// BF16 files, one file or an index (*.index.json). A tensor missing or of other extents is an
// error naming it, the HF name and both shapes, agreed on by every rank.
// Export: checkpoint::export_safetensors (collective, every rank writing its boxes) into a file in
// dtensor's names next to the target, which rank 0 converts to the HF names and layout (the
// parameters' element type, each tensor's checksum), then removes; the file and its config.json
// (GPT-2: n_positions = the rows of the table written) go through .partial names, synced,
// renamed. scripts/hf_fixtures.py writes HF-layout files with numpy, and the reference logits
// tests/unit/test_llama.cpp compares with;
// scripts/hf_transformers_fixtures.py writes checkpoints with transformers' own save_pretrained
// (and loads dtensor's export with from_pretrained: --check-export).
#pragma once

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/checkpoint/detail/agree.hpp"
#include "dtensor/checkpoint/safetensors.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/models/llama.hpp"

namespace dtensor::models {

enum class HfArch { gpt2, llama };

/// One dtensor parameter from HF tensors: its rows, each a row of one source (sources as
/// [out, in] matrices: a Conv1D source is transposed; a vector is a column of rows of one).
struct HfPiece {
  std::string name;                       // dtensor's
  std::vector<Extent> shape;              // dtensor's
  struct Source {
    std::string name;                     // HF's
    std::vector<Extent> shape;            // HF's, as stored
    bool transposed = false;              // Conv1D: stored [in, out]
    bool prefix_rows = false;             // import may find more rows (a longer position table)
  };
  std::vector<Source> sources;
  std::vector<std::pair<int, Extent>> rows;  // dtensor row r = row rows[r].second of sources[rows[r].first]
};

/// The name map of a model of configuration c (see the top of this file).
inline std::vector<HfPiece> hf_name_map(const models::GPTConfig& c, HfArch arch) {
  const Extent C = c.dim, H = c.heads, D = c.dim / c.heads, K = c.kv_heads > 0 ? c.kv_heads : c.heads;
  const Extent F = c.ffn > 0 ? c.ffn : c.mlp_ratio * c.dim, V = c.vocab;
  if (c.mla.enabled())
    throw Error("models::hf_name_map", dtensor::detail::cat("kv_lora_rank ", c.mla.kv_lora_rank,
                                                            ": multi-head latent attention (DeepSeek's checkpoints) is "
                                                            "not mapped to Hugging Face names"));
  std::vector<HfPiece> out;
  using S = HfPiece::Source;
  auto identity = [](Extent n) {
    std::vector<std::pair<int, Extent>> r;
    for (Extent i = 0; i < n; ++i) r.emplace_back(0, i);
    return r;
  };
  // A matrix [rows, cols] (or a vector [rows]) taken whole from one source.
  auto whole = [&](std::string name, std::vector<Extent> shape, S src) {
    const Extent rows = shape[0];
    out.push_back({std::move(name), std::move(shape), {std::move(src)}, identity(rows)});
  };
  if (arch == HfArch::gpt2) {
    const std::string p = "transformer.";
    whole("wte.weight", {V, C}, {p + "wte.weight", {V, C}});
    whole("wpe.weight", {c.seq, C}, {p + "wpe.weight", {c.seq, C}, false, true});
    for (Extent l = 0; l < c.layers; ++l) {
      const std::string d = "h." + std::to_string(l) + ".", h = p + d;
      for (const char* wb : {"weight", "bias"}) {
        whole(d + "ln1." + wb, {C}, {h + "ln_1." + wb, {C}});
        whole(d + "ln2." + wb, {C}, {h + "ln_2." + wb, {C}});
      }
      // c_attn columns [part * C + head * D + i] -> qkv rows [head * 3D + part * D + i].
      std::vector<std::pair<int, Extent>> qkv;
      for (Extent head = 0; head < H; ++head)
        for (Extent part = 0; part < 3; ++part)
          for (Extent i = 0; i < D; ++i) qkv.emplace_back(0, part * C + head * D + i);
      out.push_back({d + "attn.qkv.weight", {3 * C, C}, {{h + "attn.c_attn.weight", {C, 3 * C}, true}}, qkv});
      out.push_back({d + "attn.qkv.bias", {3 * C}, {{h + "attn.c_attn.bias", {3 * C}}}, qkv});
      whole(d + "attn.proj.weight", {C, C}, {h + "attn.c_proj.weight", {C, C}, true});
      whole(d + "attn.proj.bias", {C}, {h + "attn.c_proj.bias", {C}});
      whole(d + "mlp.fc1.weight", {F, C}, {h + "mlp.c_fc.weight", {C, F}, true});
      whole(d + "mlp.fc1.bias", {F}, {h + "mlp.c_fc.bias", {F}});
      whole(d + "mlp.fc2.weight", {C, F}, {h + "mlp.c_proj.weight", {F, C}, true});
      whole(d + "mlp.fc2.bias", {C}, {h + "mlp.c_proj.bias", {C}});
    }
    for (const char* wb : {"weight", "bias"}) whole(std::string("ln_f.") + wb, {C}, {p + "ln_f." + wb, {C}});
    whole("lm_head.weight", {V, C}, {"lm_head.weight", {V, C}});
  } else {
    const std::string p = "model.";
    const Extent G = H / K;
    whole("wte.weight", {V, C}, {p + "embed_tokens.weight", {V, C}});
    for (Extent l = 0; l < c.layers; ++l) {
      const std::string d = "h." + std::to_string(l) + ".", h = p + "layers." + std::to_string(l) + ".";
      whole(d + "ln1.weight", {C}, {h + "input_layernorm.weight", {C}});
      whole(d + "ln2.weight", {C}, {h + "post_attention_layernorm.weight", {C}});
      std::vector<std::pair<int, Extent>> qkv;  // per KV group: G query heads, its k head, its v head
      for (Extent g = 0; g < K; ++g) {
        for (Extent i = 0; i < G * D; ++i) qkv.emplace_back(0, g * G * D + i);
        for (int kv = 1; kv <= 2; ++kv)
          for (Extent i = 0; i < D; ++i) qkv.emplace_back(kv, g * D + i);
      }
      out.push_back({d + "attn.qkv.weight",
                     {(H + 2 * K) * D, C},
                     {{h + "self_attn.q_proj.weight", {H * D, C}},
                      {h + "self_attn.k_proj.weight", {K * D, C}},
                      {h + "self_attn.v_proj.weight", {K * D, C}}},
                     qkv});
      whole(d + "attn.proj.weight", {C, C}, {h + "self_attn.o_proj.weight", {C, C}});
      std::vector<std::pair<int, Extent>> w13;
      for (Extent j = 0; j < F; ++j) w13.emplace_back(0, j), w13.emplace_back(1, j);
      out.push_back({d + "mlp.w13.weight",
                     {2 * F, C},
                     {{h + "mlp.gate_proj.weight", {F, C}}, {h + "mlp.up_proj.weight", {F, C}}},
                     w13});
      whole(d + "mlp.w2.weight", {C, F}, {h + "mlp.down_proj.weight", {C, F}});
    }
    whole("ln_f.weight", {C}, {p + "norm.weight", {C}});
    whole("lm_head.weight", {V, C}, {"lm_head.weight", {V, C}});
  }
  return out;
}

namespace detail {

/// The headers of one HF file or of an index's files (each read once, when first needed); names
/// resolved with or without GPT-2's "transformer." prefix, lm_head falling back to the tied embedding.
class HfReader {
 public:
  explicit HfReader(const std::filesystem::path& path) : path_(path) {
    if (path.string().ends_with(".index.json")) file_of_ = checkpoint::safetensors::read_index(path);
  }
  /// The stored name of `name`, or "" when the file has none.
  std::string resolve(const std::string& name, HfArch arch) {
    std::vector<std::string> tries{name};
    if (name.starts_with("transformer.")) tries.push_back(name.substr(12));
    if (name == "lm_head.weight")
      for (const char* tied : {"transformer.wte.weight", "wte.weight", "model.embed_tokens.weight"})
        if ((arch == HfArch::gpt2) == !std::string(tied).starts_with("model.")) tries.push_back(tied);
    for (const auto& t : tries)
      if (info(t)) return t;
    return {};
  }
  const checkpoint::safetensors::TensorEntry* info(const std::string& name) {
    const auto* f = file(name);
    if (!f) return nullptr;
    auto it = f->tensors.find(name);
    return it == f->tensors.end() ? nullptr : &it->second;
  }
  /// The header of the file holding `name` (a stored name, from resolve).
  const checkpoint::safetensors::FileInfo& file_of(const std::string& name) { return *file(name); }
  /// Every tensor name the checkpoint holds: an index's weight_map (no header read), or the one
  /// file's header (read for any tensor anyway).
  std::vector<std::string> all_names() {
    std::vector<std::string> names;
    if (!file_of_.empty()) {
      for (const auto& [name, f] : file_of_) names.push_back(name);
      return names;
    }
    auto it = files_.find(path_);
    if (it == files_.end()) it = files_.emplace(path_, checkpoint::safetensors::read_header(path_)).first;
    for (const auto& [name, t] : it->second.tensors) names.push_back(name);
    return names;
  }

 private:
  const checkpoint::safetensors::FileInfo* file(const std::string& name) {
    std::filesystem::path p = path_;
    if (!file_of_.empty()) {
      auto it = file_of_.find(name);
      if (it == file_of_.end()) return nullptr;
      p = it->second;
    }
    auto it = files_.find(p);
    if (it == files_.end()) it = files_.emplace(p, checkpoint::safetensors::read_header(p)).first;
    return &it->second;
  }
  std::filesystem::path path_;
  std::map<std::string, std::filesystem::path> file_of_;
  std::map<std::filesystem::path, checkpoint::safetensors::FileInfo> files_;
};

inline Extent cols_of(const std::vector<Extent>& shape) { return shape.size() == 2 ? shape[1] : 1; }

/// Fills `out` (the box `box` of piece p, row-major over the box) from the HF sources, reading
/// only the sources' elements the box is made of: consecutive box rows that are consecutive rows
/// of one source are one read of a box of that source (see the top of this file).
template <class T>
void read_piece_box(HfReader& reader, const HfPiece& p, const std::vector<std::string>& stored, const checkpoint::Region& box,
                    T* out) {
  if (box.empty()) return;
  const bool matrix = p.shape.size() == 2;
  const Extent r0 = box.offset[0], rows = box.extent[0];
  const Extent c0 = matrix ? box.offset[1] : 0, cols = matrix ? box.extent[1] : 1;
  std::vector<double> buf;
  for (Extent r = r0; r < r0 + rows;) {
    const auto [s, first] = p.rows[std::size_t(r)];
    Extent n = 1;
    while (r + n < r0 + rows && p.rows[std::size_t(r + n)] == std::pair<int, Extent>{s, first + n}) ++n;
    const auto& src = p.sources[std::size_t(s)];
    const auto& file = reader.file_of(stored[std::size_t(s)]);
    const Extent stored_rank = Extent(file.tensors.at(stored[std::size_t(s)]).shape.size());
    // The source's box: its rows [first, first + n) of the [out, in] view and the box's columns.
    checkpoint::Region sb = stored_rank == 1 ? checkpoint::Region{{first}, {n}}
                            : src.transposed ? checkpoint::Region{{c0, first}, {cols, n}}
                                             : checkpoint::Region{{first, c0}, {n, cols}};
    buf.resize(std::size_t(n * cols));
    checkpoint::safetensors::read_box(file, stored[std::size_t(s)], sb, buf.data());
    for (Extent i = 0; i < n; ++i)
      for (Extent j = 0; j < cols; ++j)
        out[std::size_t((r - r0 + i) * cols + j)] = T(src.transposed ? buf[std::size_t(j * n + i)] : buf[std::size_t(i * cols + j)]);
    r += n;
  }
}

/// What a Hugging Face config.json says: the model configuration it describes (HF's defaults for
/// the fields it leaves out) and which of its fields were given. Refuses, naming the field, what
/// this import cannot express: biases in the attention or the MLP (attention_bias, mlp_bias true:
/// models::Llama has none), another activation than GPT-2's gelu_new or Llama's silu, and rope types
/// other than "default" and "llama3" (rope_parameters.rope_type in transformers 5, rope_scaling's
/// rope_type or type before it: linear, dynamic, yarn, longrope...).
struct HfConfigFile {
  models::GPTConfig config;
  std::set<std::string> given;  // the config.json keys read (rope: "rope_theta", "rope_scaling")
};

inline HfConfigFile read_hf_config(const std::filesystem::path& config_json, HfArch arch, const char* op) {
  namespace st = checkpoint::safetensors::detail;
  std::ifstream in(config_json);
  if (!in) throw Error(op, dtensor::detail::cat("cannot read ", config_json.string()));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = config_json.string();
  const st::Json doc = st::parse_json(text, where);
  const st::JsonObject* top = doc.object();
  if (!top) throw Error(op, dtensor::detail::cat(where, ": not a JSON object"));
  auto field = [](const st::JsonObject& o, std::string_view key) -> const st::Json* {
    for (const auto& [k, v] : o)
      if (k == key) return &v;
    return nullptr;
  };
  auto shown = [](const st::Json& v) -> std::string {
    if (const auto* s = v.string()) return "\"" + *s + "\"";
    if (const auto* n = v.number()) return dtensor::detail::cat(*n);
    if (const auto* b = std::get_if<bool>(&v.v)) return *b ? "true" : "false";
    if (std::holds_alternative<std::nullptr_t>(v.v)) return "null";
    return v.object() ? "{...}" : "[...]";
  };
  auto refuse = [&](const std::string& name, const std::string& value, const std::string& why) {
    throw Error(op, dtensor::detail::cat(where, ": ", name, " = ", value, ": ", why));
  };
  HfConfigFile out;
  models::GPTConfig& c = out.config;
  // A number field of `o` (named `name` in messages); absent or null: nullopt.
  auto number = [&](const st::JsonObject& o, std::string_view key, const std::string& name) -> std::optional<double> {
    const st::Json* v = field(o, key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->v)) return std::nullopt;
    if (!v->number()) refuse(name, shown(*v), "not a number");
    return *v->number();
  };
  auto whole = [&](std::string_view key, Extent& into) {
    if (const auto v = number(*top, key, std::string(key))) {
      if (!(*v >= 1 && *v == std::floor(*v) && *v < 9.0e15)) refuse(std::string(key), shown(*field(*top, key)), "not a positive integer");
      into = Extent(*v);
      out.given.insert(std::string(key));
    }
  };
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (const st::Json* v = field(*top, bias); v && std::get_if<bool>(&v->v) && *std::get_if<bool>(&v->v))
      refuse(bias, "true", "biases this import does not implement (models::Llama has none)");
  if (arch == HfArch::gpt2) {
    // transformers' GPT2Config defaults
    c.vocab = 50257, c.seq = 1024, c.dim = 768, c.heads = 12, c.layers = 12, c.norm_eps = 1e-5;
    whole("vocab_size", c.vocab);
    whole("n_positions", c.seq);
    whole("n_embd", c.dim);
    whole("n_head", c.heads);
    whole("n_layer", c.layers);
    c.ffn = 4 * c.dim;
    whole("n_inner", c.ffn);  // null: 4 n_embd
    if (const auto eps = number(*top, "layer_norm_epsilon", "layer_norm_epsilon")) c.norm_eps = *eps, out.given.insert("layer_norm_epsilon");
    if (const st::Json* act = field(*top, "activation_function"); act && !(act->string() && *act->string() == "gelu_new"))
      refuse("activation_function", shown(*act), "GPT-2's import implements gelu_new (ops::gelu) only");
    return out;
  }
  // transformers' LlamaConfig defaults
  c.vocab = 32000, c.seq = 2048, c.dim = 4096, c.heads = 32, c.layers = 32, c.ffn = 11008, c.norm_eps = 1e-6;
  c.rope_theta = 10000, c.bias = false;
  whole("vocab_size", c.vocab);
  whole("max_position_embeddings", c.seq);
  whole("hidden_size", c.dim);
  whole("num_attention_heads", c.heads);
  whole("num_hidden_layers", c.layers);
  whole("intermediate_size", c.ffn);
  c.kv_heads = c.heads;
  whole("num_key_value_heads", c.kv_heads);
  Extent head_dim = c.dim / c.heads;
  whole("head_dim", head_dim);
  if (head_dim != c.dim / c.heads)
    refuse("head_dim", dtensor::detail::cat(head_dim),
           dtensor::detail::cat("models::Llama's heads are hidden_size / num_attention_heads = ", c.dim / c.heads,
                                " wide"));
  if (const auto eps = number(*top, "rms_norm_eps", "rms_norm_eps")) c.norm_eps = *eps, out.given.insert("rms_norm_eps");
  if (const st::Json* act = field(*top, "hidden_act"); act && !(act->string() && *act->string() == "silu"))
    refuse("hidden_act", shown(*act), "models::Llama's SwiGLU uses silu");
  if (const auto theta = number(*top, "rope_theta", "rope_theta")) c.rope_theta = *theta, out.given.insert("rope_theta");
  // The rope parameters: transformers 5's rope_parameters (theta inside), or rope_scaling before it.
  // Both given (a config edited by hand, or converted): they must name the same rope type.
  const st::JsonObject* rope = nullptr;
  std::string rope_name, type;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const st::Json* v = field(*top, key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->v)) continue;
    if (!v->object()) refuse(key, shown(*v), "not an object");
    std::string its = "default";
    for (const char* k : {"type", "rope_type"})  // rope_type wins, as in transformers
      if (const st::Json* t = field(*v->object(), k)) {
        if (!t->string()) refuse(std::string(key) + "." + k, shown(*t), "not a string");
        its = *t->string();
      }
    if (rope && its != type)
      refuse(key, "{\"rope_type\": \"" + its + "\", ...}",
             dtensor::detail::cat("rope_parameters says rope_type \"", type, "\": which one holds is ambiguous"));
    if (!rope) rope = v->object(), rope_name = key, type = its;
  }
  if (!rope) return out;
  if (const auto theta = number(*rope, "rope_theta", rope_name + ".rope_theta")) c.rope_theta = *theta, out.given.insert("rope_theta");
  if (type == "default") return out;
  if (type != "llama3")
    refuse(rope_name + ".rope_type", "\"" + type + "\"",
           "this rope type is not implemented (implemented: \"default\", \"llama3\"); the logits would differ");
  out.given.insert("rope_scaling");
  RopeScaling& s = c.rope_scaling;
  auto need = [&](const char* key, double& into) {
    const auto v = number(*rope, key, rope_name + "." + key);
    if (!v) refuse(rope_name + "." + key, "(absent)", "llama3 rope scaling needs it");
    into = *v;
  };
  need("factor", s.factor);
  need("low_freq_factor", s.low_freq_factor);
  need("high_freq_factor", s.high_freq_factor);
  if (const auto orig = number(*rope, "original_max_position_embeddings", rope_name + ".original_max_position_embeddings"))
    s.original_max_position = *orig;
  else if (const auto top_orig = number(*top, "original_max_position_embeddings", "original_max_position_embeddings"))
    s.original_max_position = *top_orig;
  else
    s.original_max_position = double(c.seq);  // transformers' fallback: max_position_embeddings
  if (!(s.factor > 0) || !s.valid())
    refuse(rope_name, dtensor::detail::cat("{factor ", s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ",
                                           s.high_freq_factor, ", original_max_position_embeddings ", s.original_max_position, "}"),
           "llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and original_max_position_embeddings > 0");
  return out;
}

/// Checks that a config.json next to the checkpoint describes the model being filled: every size
/// it gives, eps, rope_theta and the rope scaling (GPT-2: n_positions at least the model's seq,
/// the import taking the first rows); refuses what read_hf_config refuses. No config.json: the
/// tensors' names and shapes are all there is to check.
inline void check_config_json(const std::filesystem::path& checkpoint_path, const models::GPTConfig& model, HfArch arch,
                              const char* op) {
  const std::filesystem::path config = checkpoint_path.parent_path() / "config.json";
  if (!std::filesystem::exists(config)) return;
  const HfConfigFile file = read_hf_config(config, arch, op);
  const models::GPTConfig& f = file.config;
  auto differ = [&](const char* key, const std::string& theirs, const char* ours_name, const std::string& ours) {
    throw Error(op, dtensor::detail::cat(config.string(), ": ", key, " = ", theirs, ", the model's ", ours_name, " is ", ours,
                                         " (build the model from models::hf_config(", config.string(), "))"));
  };
  auto same = [&](const char* key, Extent theirs, const char* ours_name, Extent ours) {
    if (file.given.count(key) && theirs != ours) differ(key, dtensor::detail::cat(theirs), ours_name, dtensor::detail::cat(ours));
  };
  auto close = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
  const Extent kv = model.kv_heads > 0 ? model.kv_heads : model.heads, ffn = model.ffn > 0 ? model.ffn : model.mlp_ratio * model.dim;
  if (arch == HfArch::gpt2) {
    same("vocab_size", f.vocab, "vocab", model.vocab);
    same("n_embd", f.dim, "dim", model.dim);
    same("n_head", f.heads, "heads", model.heads);
    same("n_layer", f.layers, "layers", model.layers);
    same("n_inner", f.ffn, "ffn", ffn);
    if (file.given.count("n_positions") && f.seq < model.seq)
      differ("n_positions", dtensor::detail::cat(f.seq), "seq", dtensor::detail::cat(model.seq, " (more positions than the table holds)"));
    if (file.given.count("layer_norm_epsilon") && !close(f.norm_eps, model.norm_eps))
      differ("layer_norm_epsilon", dtensor::detail::cat(f.norm_eps), "norm_eps", dtensor::detail::cat(model.norm_eps));
    return;
  }
  same("vocab_size", f.vocab, "vocab", model.vocab);
  same("hidden_size", f.dim, "dim", model.dim);
  same("num_attention_heads", f.heads, "heads", model.heads);
  same("num_hidden_layers", f.layers, "layers", model.layers);
  same("num_key_value_heads", f.kv_heads, "kv_heads", kv);
  same("intermediate_size", f.ffn, "ffn", ffn);
  if (file.given.count("rms_norm_eps") && !close(f.norm_eps, model.norm_eps))
    differ("rms_norm_eps", dtensor::detail::cat(f.norm_eps), "norm_eps", dtensor::detail::cat(model.norm_eps));
  const double theta = model.rope_theta > 0 ? model.rope_theta : models::LlamaLayers::default_rope_theta;
  if (!close(f.rope_theta, theta)) differ("rope_theta", dtensor::detail::cat(f.rope_theta), "rope_theta", dtensor::detail::cat(theta));
  const RopeScaling &a = f.rope_scaling, &b = model.rope_scaling;
  if (a.on() != b.on() || (a.on() && !(close(a.factor, b.factor) && close(a.low_freq_factor, b.low_freq_factor) &&
                                       close(a.high_freq_factor, b.high_freq_factor) &&
                                       close(a.original_max_position, b.original_max_position))))
    differ("rope scaling",
           a.on() ? dtensor::detail::cat("llama3 {factor ", a.factor, ", low_freq_factor ", a.low_freq_factor, ", high_freq_factor ",
                                         a.high_freq_factor, ", original_max_position_embeddings ", a.original_max_position, "}")
                  : std::string("none"),
           "rope_scaling",
           b.on() ? dtensor::detail::cat("llama3 {factor ", b.factor, ", low_freq_factor ", b.low_freq_factor, ", high_freq_factor ",
                                         b.high_freq_factor, ", original_max_position ", b.original_max_position, "}")
                  : std::string("none"));
}

/// The config.json transformers' from_pretrained reads for an export of a model of
/// configuration c: its sizes (GPT-2: n_positions is c.seq, the rows of the position table the
/// export holds, so from_pretrained loads it as written), eps, rope_theta and llama3 scaling, no
/// biases beyond GPT-2's, untied lm_head (the export writes it).
inline void write_config_json(const std::filesystem::path& file, const models::GPTConfig& c, HfArch arch) {
  auto num = [](double v) {
    char b[32];
    const auto r = std::to_chars(b, b + sizeof b, v);
    std::string t(b, r.ptr);
    return t.find_first_of(".e") == std::string::npos ? t + ".0" : t;
  };
  using dtensor::detail::cat;
  const Extent kv = c.kv_heads > 0 ? c.kv_heads : c.heads;
  const Extent ffn = c.ffn > 0 ? c.ffn : c.mlp_ratio * c.dim;
  // Llama's rotary parameters as transformers 5 writes them (rope_theta also at the top, as
  // transformers 4 reads it); models::Llama's theta 0 means its default.
  const double theta = c.rope_theta > 0 ? c.rope_theta : models::LlamaLayers::default_rope_theta;
  const RopeScaling& s = c.rope_scaling;
  const std::string rope =
      s.on() ? cat("{\"rope_type\": \"llama3\", \"rope_theta\": ", num(theta), ", \"factor\": ", num(s.factor),
                   ", \"low_freq_factor\": ", num(s.low_freq_factor), ", \"high_freq_factor\": ", num(s.high_freq_factor),
                   ", \"original_max_position_embeddings\": ", Extent(s.original_max_position), "}")
             : cat("{\"rope_type\": \"default\", \"rope_theta\": ", num(theta), "}");
  const std::string text =
      arch == HfArch::gpt2
          ? cat("{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": ", c.vocab,
                ",\n  \"n_positions\": ", c.seq, ",\n  \"n_ctx\": ", c.seq, ",\n  \"n_embd\": ", c.dim, ",\n  \"n_layer\": ",
                c.layers, ",\n  \"n_head\": ", c.heads, ",\n  \"n_inner\": ", ffn, ",\n  \"layer_norm_epsilon\": ",
                num(c.norm_eps), ",\n  \"activation_function\": \"gelu_new\",\n  \"tie_word_embeddings\": false\n}\n")
          : cat("{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"vocab_size\": ", c.vocab,
                ",\n  \"hidden_size\": ", c.dim, ",\n  \"intermediate_size\": ", ffn, ",\n  \"num_hidden_layers\": ",
                c.layers, ",\n  \"num_attention_heads\": ", c.heads, ",\n  \"num_key_value_heads\": ", kv,
                ",\n  \"head_dim\": ", c.dim / c.heads, ",\n  \"max_position_embeddings\": ", c.seq,
                ",\n  \"rms_norm_eps\": ", num(c.norm_eps), ",\n  \"rope_theta\": ", num(theta), ",\n  \"rope_parameters\": ",
                rope, ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
                "  \"tie_word_embeddings\": false\n}\n");
  constexpr const char* op = "models::export_hf_safetensors";
  checkpoint::safetensors::detail::Fd fd(file, O_WRONLY | O_CREAT | O_TRUNC, op);
  fd.write_at(text.data(), text.size(), 0, op);
  fd.sync(op);
}

}  // namespace detail

/// The model configuration a Hugging Face config.json describes (`path`: the file, or the folder
/// holding it): sizes, eps, rope_theta and llama3 rope scaling, HF's defaults for fields left
/// out (Llama's seq is max_position_embeddings, GPT-2's n_positions). Refuses, naming the field,
/// what the import cannot express (see detail::read_hf_config).
inline models::GPTConfig hf_config(const std::filesystem::path& path, HfArch arch) {
  const auto file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  return detail::read_hf_config(file, arch, "models::hf_config").config;
}

/// Fills the model's parameters from a Hugging Face checkpoint (one .safetensors file or an
/// *.index.json). Collective over the model's mesh only in agreeing on errors.
template <class Model>
void import_hf_safetensors(const std::filesystem::path& path, Model& model, HfArch arch) {
  constexpr const char* op = "models::import_hf_safetensors";
  const models::GPTConfig& cfg = model.config();
  auto slots = checkpoint::parameter_slots(model.units(), model.mesh());
  checkpoint::detail::agree(model.mesh().comm(), op, dtensor::detail::error_of([&] {
    detail::check_config_json(path, cfg, arch, op);
    detail::HfReader reader(path);
    std::map<std::string, const HfPiece*> piece_of;
    const auto map = hf_name_map(cfg, arch);
    for (const auto& p : map) piece_of[p.name] = &p;
    for (auto& slot : slots) {
      auto it = piece_of.find(slot.name);
      if (it == piece_of.end())
        throw Error(op, dtensor::detail::cat("parameter '", slot.name, "' has no Hugging Face name (not a ",
                                             arch == HfArch::gpt2 ? "GPT-2" : "Llama", " model of this configuration?)"));
      const HfPiece& piece = *it->second;
      if (piece.shape != slot.shape)
        throw Error(op, dtensor::detail::cat("parameter '", slot.name, "' is ", to_string(slot.shape), ", the map's ",
                                             to_string(piece.shape)));
      if (piece.shape.size() > 2)
        throw Error(op, dtensor::detail::cat("parameter '", slot.name, "' is ", to_string(piece.shape),
                                             ": the map takes vectors and matrices"));
      std::vector<std::string> stored;
      for (const auto& src : piece.sources) {
        stored.push_back(reader.resolve(src.name, arch));
        if (stored.back().empty())
          throw Error(op, dtensor::detail::cat(path.string(), " has no tensor '", src.name, "' (for '", slot.name, "')"));
        const auto& shape = reader.info(stored.back())->shape;
        const bool ok = shape.size() == src.shape.size() &&
                        (src.prefix_rows ? shape[0] >= src.shape[0] && shape.back() == src.shape.back() : shape == src.shape);
        if (!ok)
          throw Error(op, dtensor::detail::cat(path.string(), ": tensor '", stored.back(), "' is ", to_string(shape), ", ",
                                               slot.name, " needs ", to_string(src.shape),
                                               src.prefix_rows ? " (or more rows)" : ""));
      }
      detail::read_piece_box(reader, piece, stored, slot.box, slot.data);
    }
    {  // dtensor's checksums (an export of this library; HF's own files have none): each tensor
       // read whole once in all, by the rank its place falls to
      std::set<std::string> read;
      for (const auto& p : map)
        for (const auto& src : p.sources) read.insert(reader.resolve(src.name, arch));
      const auto& comm = model.mesh().comm();
      std::size_t turn = 0;
      for (const auto& name : read)
        if (!name.empty() && turn++ % std::size_t(comm.size()) == std::size_t(comm.rank()))
          checkpoint::safetensors::verify_checksum(reader.file_of(name), name);
    }
    if (model.mesh().comm().rank() == 0) {  // after the missing and misshapen: the same verdict everywhere (agree)
      // A tensor of the checkpoint that no parameter reads (biases the model lacks, more layers)
      // would leave the model silently unlike the checkpoint. Buffers that are no weights pass.
      std::set<std::string> used;
      for (const auto& p : map)
        for (const auto& src : p.sources) used.insert(reader.resolve(src.name, arch));
      std::string unread;
      int count = 0;
      for (const auto& name : reader.all_names()) {
        if (used.count(name) || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
            name.ends_with("rotary_emb.inv_freq"))
          continue;
        unread += count++ < 5 ? " '" + name + "'" : std::string();
      }
      if (count > 0)
        throw Error(op, dtensor::detail::cat(path.string(), " holds ", count, " tensors this ",
                                             arch == HfArch::gpt2 ? "GPT-2" : "Llama", " model has no place for:", unread,
                                             count > 5 ? " ..." : "",
                                             " (biases it lacks, more layers, another architecture?)"));
    }
  }));
}

/// Writes the model's parameters as a Hugging Face checkpoint (one .safetensors file, HF names
/// and layouts, the parameters' element type) and its config.json next to it. Collective over the model's mesh.
template <class Model>
void export_hf_safetensors(const std::filesystem::path& path, Model& model, HfArch arch) {
  constexpr const char* op = "models::export_hf_safetensors";
  auto slots = checkpoint::parameter_slots(model.units(), model.mesh());
  using T = typename decltype(slots)::value_type::value_type;
  const std::filesystem::path staging = path.string() + ".dtensor-names";
  checkpoint::export_safetensors(staging, model.mesh(), slots);
  checkpoint::detail::agree(model.mesh().comm(), op, dtensor::detail::error_of([&] {
    if (model.mesh().comm().rank() != 0) return;
    const auto file = checkpoint::safetensors::read_header(staging);
    std::map<std::string, std::vector<T>> hf;  // HF name -> values as stored
    std::map<std::string, std::vector<Extent>> shapes;
    for (const auto& piece : hf_name_map(model.config(), arch)) {
      Extent n = 1;
      for (Extent d : piece.shape) n *= d;
      std::vector<double> v(static_cast<std::size_t>(n));
      checkpoint::safetensors::read_box(file, piece.name, checkpoint::Region{std::vector<Extent>(piece.shape.size(), 0), piece.shape},
                                        v.data());
      const Extent cols = detail::cols_of(piece.shape);
      for (const auto& src : piece.sources) {
        shapes[src.name] = src.shape;
        hf[src.name].resize(std::size_t(std::accumulate(src.shape.begin(), src.shape.end(), Extent(1), std::multiplies<>())));
      }
      for (std::size_t r = 0; r < piece.rows.size(); ++r) {
        const auto [s, row] = piece.rows[r];
        const auto& src = piece.sources[std::size_t(s)];
        auto& dst = hf[src.name];
        for (Extent c = 0; c < cols; ++c) {
          const std::size_t at = src.transposed ? std::size_t(c * src.shape[1] + row) : std::size_t(row * detail::cols_of(src.shape) + c);
          dst[at] = T(v[r * std::size_t(cols) + std::size_t(c)]);
        }
      }
    }
    std::vector<checkpoint::safetensors::Named<T>> named;
    for (const auto& [name, values] : hf) named.push_back({name, shapes[name], values.data()});
    // Temporary names, synced, renamed: a failed write leaves nothing loadable (nor a config.json
    // describing a file that is not there).
    const std::filesystem::path partial = path.string() + ".partial", config = path.parent_path() / "config.json";
    try {
      checkpoint::safetensors::write(partial, named);
      detail::write_config_json(config.string() + ".partial", model.config(), arch);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(partial, ec);
      std::filesystem::remove(config.string() + ".partial", ec);
      std::filesystem::remove(staging, ec);
      throw;
    }
    std::filesystem::remove(staging);
    checkpoint::detail::commit_file(partial, path, op);
    checkpoint::detail::commit_file(config.string() + ".partial", config, op);
  }));
}

}  // namespace dtensor::models
