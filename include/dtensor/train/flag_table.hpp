// dtensor/train/flag_table.hpp — a program's flags as one table: each flag one row (its name, the
// metavariable of its value, its help, and how the value is checked and stored), from which the
// parse loop, the usage synopsis and --help are generated.
//
//   const train::cli::FlagTable<Options> table{
//       {"", "", "the model:"},                                                 // a heading
//       {"--layers", "N", "transformer blocks (default 4)", integer(&Options::layers, 1)},
//       {"--lr", "X", "AdamW's learning rate", positive(&Options::lr, 1e6)},
//       {"--backend", "threads|mpi", "the ranks' runtime", choice(&Options::backend, {"threads", "mpi"})},
//       {"--checkpoint", "", "recompute each block in its backward", set_to(&Options::checkpoint, true)},
//   };
//   const auto given = train::cli::parse_flags(table, o, argc, argv, "train_gpt");  // --help: exits 0
//
// A row's setter gets the flag and its value (none for a switch: a row without metavariable) and
// throws UsageError with the wording of train/flags.hpp ("--steps 12x": "--steps expects a whole
// number, got '12x'"); the parse loop adds the rest: "unknown flag '--x'", "--x needs a value",
// "--x needs a value, got ''". What depends on several flags is the program's, after the parse.
//
// Each row also reads its flag's value back as text (the kinds below do; a row with a hand-written
// setter gives it with valued()), so the ranks' settings agreement is the table's too:
//
//   require_same_settings(*world, "train_gpt", train::cli::settings_of(table, o));
//
// one setting per flag, named by the flag: a rank given another --lr is told "--lr" differs.
#pragma once

#include <algorithm>
#include <charconv>
#include <concepts>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/comm/settings_agreement.hpp"
#include "dtensor/nn/context_options.hpp"
#include "dtensor/nn/recompute.hpp"
#include "dtensor/train/flags.hpp"

namespace dtensor::train::cli {

/// A value as the settings agreement compares it: numbers in their shortest exact text (3e-3 and
/// 0.003 agree, 0.0030001 does not), lists joined by commas, an unset optional switch "default".
template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "on" : "off";
  } else if constexpr (std::is_arithmetic_v<T>) {
    char b[32];
    const auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
  } else if constexpr (std::is_convertible_v<T, std::string>) {
    return std::string(v);
  } else if constexpr (requires { v.to_string(); }) {
    return v.to_string();
  } else if constexpr (requires { std::string(name_of(v)); }) {
    return std::string(name_of(v));
  } else if constexpr (requires { v.has_value(); }) {
    return v ? value_text(*v) : "default";
  } else {
    std::string s;
    for (const auto& e : v) {  // two appends: GCC 12's -Wrestrict misreads "a" + std::string at -O3
      if (!s.empty()) s += ',';
      s += value_text(e);
    }
    return s;
  }
}

/// A row's setter that also reads the value back (every kind below returns one).
template <class Set, class Get>
struct Field {
  Set set;
  Get get;
  template <class O>
  void operator()(O& o, const std::string& flag, const std::string& v) const {
    set(o, flag, v);
  }
  template <class O>
  std::string value(const O& o) const {
    return get(o);
  }
};

template <class Set, class Get>
Field(Set, Get) -> Field<Set, Get>;  // clang 14: no deduction for aggregates without a guide

/// A hand-written setter with the member it sets, whose value the settings agreement reads.
template <class Set, class C, class T>
auto valued(Set set, T C::* m) {
  return Field{set, [=](const C& o) { return value_text(o.*m); }};
}

/// One row: a flag, or (no name) a heading of the help.
template <class O>
struct Flag {
  std::string name;     // "--layers"; empty: a heading
  std::string metavar;  // "N", "FILE", "a|b"; empty: a switch, which takes no value
  std::string help;     // what it does, its default and its bounds
  std::function<void(O&, const std::string& flag, const std::string& value)> set{};
  std::function<std::string(const O&)> value{};  // the flag's value as text (settings_of)

  Flag(std::string n, std::string m, std::string h) : name(std::move(n)), metavar(std::move(m)), help(std::move(h)) {}
  template <class Set>
  Flag(std::string n, std::string m, std::string h, Set s)
      : name(std::move(n)), metavar(std::move(m)), help(std::move(h)), set(s) {
    if constexpr (requires(const O& o) { s.value(o); }) value = [s](const O& o) { return s.value(o); };
  }
};

template <class O>
using FlagTable = std::vector<Flag<O>>;

/// Every flag's value, named by the flag, for the ranks' agreement at setup
/// (comm/settings_agreement.hpp). A row that sets a value but cannot read it back is the table's
/// mistake (a std::logic_error naming it), never a flag the ranks silently do not compare.
template <class O>
std::vector<Setting> settings_of(const FlagTable<O>& table, const O& o) {
  std::vector<Setting> settings;
  for (const auto& f : table) {
    if (f.name.empty() || !f.set) continue;  // a heading, --help
    if (!f.value) throw std::logic_error("the flag table's row " + f.name + " has no value (use valued())");
    settings.push_back({f.name, f.value(o)});
  }
  return settings;
}

// ---- the kinds of values: each returns a row's setter

/// A whole number in [lo, hi] of the member's own type (flag_value's checks and messages).
template <class C, std::integral T>
auto integer(T C::* m, std::type_identity_t<T> lo, std::type_identity_t<T> hi = std::numeric_limits<T>::max()) {
  return valued([=](C& o, const std::string& flag, const std::string& v) { o.*m = flag_value<T>(flag, v, lo, hi); }, m);
}

/// A finite number > 0 and at most hi (positive_flag_value's checks and messages).
template <class C>
auto positive(double C::* m, double hi = std::numeric_limits<double>::max()) {
  return valued([=](C& o, const std::string& flag, const std::string& v) { o.*m = positive_flag_value(flag, v, hi); },
                m);
}

/// Any text (the parse loop has refused an empty one).
template <class C>
auto text(std::string C::* m) {
  return valued([=](C& o, const std::string&, const std::string& v) { o.*m = v; }, m);
}

/// "a, b or c": the choices as the messages list them.
inline std::string either(const std::vector<std::string>& choices) {
  std::string s;
  for (std::size_t i = 0; i < choices.size(); ++i)
    s += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return s;
}

/// One of `choices`, else "--flag is a, b or c, got 'x'".
template <class C>
auto choice(std::string C::* m, std::vector<std::string> choices) {
  return valued(
      [=](C& o, const std::string& flag, const std::string& v) {
        if (std::find(choices.begin(), choices.end(), v) == choices.end())
          throw UsageError(flag + " is " + either(choices) + ", got '" + v + "'");
        o.*m = v;
      },
      m);
}

/// A switch: the member set to `to` (--sp true, --no-sp false; an optional member too); its
/// value is "on" when the member holds `to`.
template <class C, class T, class V>
auto set_to(T C::* m, V to) {
  return Field{[=](C& o, const std::string&, const std::string&) { o.*m = to; },
               [=](const C& o) { return value_text(bool(o.*m == to)); }};
}

/// A comma list of names, each kept once in the order given; `none`: the message when it names none.
template <class C>
auto comma_list(std::vector<std::string> C::* m, std::string none) {
  return valued(
      [=](C& o, const std::string&, const std::string& v) {
        std::stringstream list(v);
        for (std::string w; std::getline(list, w, ',');)
          if (!w.empty() && std::find((o.*m).begin(), (o.*m).end(), w) == (o.*m).end()) (o.*m).push_back(w);
        if ((o.*m).empty()) throw UsageError(none);
      },
      m);
}

/// What the blocks recompute in their backward (nn::Recompute's spelling: none, full, selective
/// or a list of modules), else "--recompute x: " and the parse's reason.
template <class C>
auto recompute(nn::Recompute C::* m) {
  return valued(
      [=](C& o, const std::string& flag, const std::string& v) {
        try {
          o.*m = nn::Recompute::parse(v);
        } catch (const Error& e) {
          throw UsageError(flag + " " + v + ": " + e.what());
        }
      },
      m);
}

/// Each value appended, in order (a flag given several times).
template <class C>
auto append(std::vector<std::string> C::* m) {
  return valued([=](C& o, const std::string&, const std::string& v) { (o.*m).push_back(v); }, m);
}

/// `set`, then the member `marker` true: the program refuses a flag given where it has no effect.
template <class C, class Set>
auto marking(Set set, bool C::* marker) {
  return Field{[=](C& o, const std::string& flag, const std::string& v) {
                 set(o, flag, v);
                 o.*marker = true;
               },
               [=](const C& o) { return set.value(o); }};
}

/// A program's table from its parts in order: the library's sections (mesh_flag_rows,
/// trainer_flag_rows, ...) and its own rows.
template <class O>
FlagTable<O> joined_rows(std::initializer_list<FlagTable<O>> parts) {
  FlagTable<O> table;
  for (const auto& part : parts) table.insert(table.end(), part.begin(), part.end());
  return table;
}

// ---- the parse and the help

/// The usage synopsis: "usage: PROGRAM [--a N] [--b] ...", wrapped at 120 columns.
template <class O>
std::string flags_synopsis(const FlagTable<O>& table, const std::string& program) {
  std::string out = "usage: " + program, line = out;
  const std::string indent(8 + program.size(), ' ');
  for (const auto& f : table) {
    if (f.name.empty()) continue;
    const std::string item = " [" + f.name + (f.metavar.empty() ? "" : " " + f.metavar) + "]";
    if (line.size() + item.size() > 120) out += "\n" + indent, line = indent;
    out += item, line += item;
  }
  return out + "\n";
}

/// `text` wrapped at 120 columns, each line after the first indented by `indent`.
inline std::string wrap_help(const std::string& text, std::size_t column, std::size_t indent) {
  std::istringstream words(text);
  std::string out, word;
  for (std::size_t at = column; words >> word;) {
    if (at > indent && at + 1 + word.size() > 120) out += "\n" + std::string(indent, ' '), at = indent;
    else if (at > column || (at == column && !out.empty())) out += ' ', ++at;
    out += word, at += word.size();
  }
  return out;
}

/// --help: the synopsis, then every row (a heading, or a flag with its help from column 30).
template <class O>
std::string flags_help(const FlagTable<O>& table, const std::string& program) {
  constexpr std::size_t column = 30;
  std::string out = flags_synopsis(table, program);
  for (const auto& f : table) {
    if (f.name.empty()) {
      out += "\n" + wrap_help(f.help, 0, 2) + "\n";
      continue;
    }
    std::string head = "  " + f.name + (f.metavar.empty() ? "" : " " + f.metavar);
    if (head.size() + 1 > column) out += head + "\n", head.clear();
    head.resize(column, ' ');
    out += head + wrap_help(f.help, column, column) + "\n";
  }
  return out;
}

/// Reads argv into o by the table: --help (or -h) anywhere prints flags_help and exits 0 before
/// any flag is checked; else every flag must be a row's, with a non-empty value where it takes
/// one. Returns the flags given, in order (what a program checks "given" against).
template <class O>
std::vector<std::string> parse_flags(const FlagTable<O>& table, O& o, int argc, char** argv,
                                     const std::string& program) {
  if (help_requested(argc, argv)) {
    std::cout << flags_help(table, program);
    std::exit(0);
  }
  for (auto f = table.begin(); f != table.end(); ++f)  // a second row of a name would never be reached
    if (!f->name.empty() && std::any_of(f + 1, table.end(), [&](const Flag<O>& g) { return g.name == f->name; }))
      throw std::logic_error(program + "'s flag table has two rows for " + f->name);
  std::vector<std::string> given;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto row =
        std::find_if(table.begin(), table.end(), [&](const Flag<O>& f) { return !f.name.empty() && f.name == a; });
    if (row == table.end()) throw UsageError("unknown flag '" + a + "'");
    if (row->metavar.empty()) {
      row->set(o, a, "");
    } else {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      row->set(o, a, nonempty_flag_value(a, argv[++i]));  // "" is no value (flags.hpp)
    }
    given.push_back(a);
  }
  return given;
}

/// The parallelism flags of MeshFlags (both trainers'), after a heading of the program's that
/// gives its defaults.
template <class O>
FlagTable<O> mesh_flag_rows(const std::string& heading) {
  static_assert(std::is_base_of_v<MeshFlags, O>);
  auto dim = [](int MeshFlags::* m) {
    return valued([=](O& o, const std::string& flag, const std::string& v) { o.*m = mesh_flag(flag, v); }, m);
  };
  return {
      {"", "", heading},
      {"--pp", "N", "pipeline stages (--schedule over --microbatches)", dim(&MeshFlags::pp)},
      {"--dp", "N", "data-parallel replicas (DDP; with --fsdp > 1, HSDP's replicas)", dim(&MeshFlags::dp)},
      {"--fsdp", "N", "parameter shards (FSDP / ZeRO --zero; 1: DDP over --dp)", dim(&MeshFlags::fsdp)},
      {"--cp", "N", "context parallelism: every sequence split over N ranks (--cp-kind)", dim(&MeshFlags::cp)},
      {"--tp", "N",
       "Megatron tensor parallelism: heads, MLP and vocabulary split over N ranks, with sequence "
       "parallelism between them unless --no-sp",
       dim(&MeshFlags::tp)},
      {"--ep", "N", "the MoE experts split over N ranks (with --experts; N divides dp x fsdp x cp)",
       dim(&MeshFlags::ep)},
      {"--zero", "1|2|3", "the ZeRO stage over fsdp x cp (default 3 with --fsdp > 1, else 1: DDP)",
       integer(&O::zero, 1, 3)},
      {"--sp", "", "sequence parallelism with --tp (the default)", set_to(&O::sp, true)},
      {"--no-sp", "", "no sequence parallelism: --tp's activations replicated between the split layers",
       set_to(&O::sp, false)},
      {"--reshard-after-forward", "", "ZeRO-3 gathers each unit per micro-batch (the default at pp 1)",
       set_to(&O::reshard_after_forward, true)},
      {"--no-reshard-after-forward", "",
       "ZeRO-3 keeps a pipeline stage gathered for the step (the default with a "
       "pipeline: fewer all-gathers, more memory)",
       set_to(&O::reshard_after_forward, false)},
      {"--cp-kind", "ring|allgather|ulysses",
       "context attention (default ring; ulysses: --heads a multiple of tp x cp)",
       valued(
           [](O& o, const std::string&, const std::string& v) {
             try {
               o.cp_kind = dtensor::nn::parse_context_kind(v);
             } catch (const dtensor::Error&) {
               throw UsageError("--cp-kind is ring, allgather or ulysses, got '" + v + "'");
             }
           },
           &MeshFlags::cp_kind)},
      {"--schedule", "gpipe|1f1b|interleaved|zb|zbv|dualpipev",
       "the pipeline schedule (default 1f1b; interleaved, zbv "
       "and dualpipev put 2 stages on each rank)",
       text(&O::schedule)},
      {"--microbatches", "M", "micro-batches per step (default 2 x pp with a pipeline, else 1); M divides --batch",
       integer(&O::microbatches, 1)},
  };
}

/// Whether `flag` is one of the parallelism flags (a row of mesh_flag_rows).
template <class O>
bool is_mesh_flag(const std::string& flag) {
  static const FlagTable<O> rows = mesh_flag_rows<O>("");
  return std::any_of(rows.begin(), rows.end(), [&](const Flag<O>& f) { return !f.name.empty() && f.name == flag; });
}

}  // namespace dtensor::train::cli
