// The load gauge of bench/compile/measure.sh: a unit of the standard library only (regex, maps,
// variants), compiled unchanged before each measured compile. Its user time says how loaded the
// machine was when the measurement next to it ran; it depends on no version of dtensor.
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

using Value = std::variant<long, double, std::string, std::vector<int>>;

struct Describe {
  std::string operator()(long v) const { return "long " + std::to_string(v); }
  std::string operator()(double v) const { return "double " + std::to_string(v); }
  std::string operator()(const std::string& v) const { return "string " + v; }
  std::string operator()(const std::vector<int>& v) const { return "vector of " + std::to_string(v.size()); }
};

int main(int argc, char** argv) {
  const std::regex assignment(R"(^\s*([A-Za-z_]\w*)\s*=\s*(-?\d+(?:\.\d+)?|"[^"]*")\s*$)");
  const std::wregex word(LR"(\w+)");
  std::map<std::string, Value> vars;
  std::unordered_map<std::string, std::vector<std::string>> words;
  for (int i = 1; i < argc; ++i) {
    std::string line = argv[i];
    std::smatch m;
    if (std::regex_match(line, m, assignment)) {
      const std::string v = m[2];
      if (v.front() == '"') vars[m[1]] = v.substr(1, v.size() - 2);
      else if (v.find('.') != std::string::npos) vars[m[1]] = std::stod(v);
      else vars[m[1]] = std::stol(v);
    } else {
      vars[line] = std::vector<int>(line.size(), 1);
    }
    words[line].push_back(std::regex_replace(line, std::regex("[aeiou]"), "_"));
  }
  std::wstring text = L"a few words to search";
  std::size_t n = std::distance(std::wsregex_iterator(text.begin(), text.end(), word), std::wsregex_iterator());
  for (const auto& [k, v] : vars) std::printf("%s: %s\n", k.c_str(), std::visit(Describe{}, v).c_str());
  std::printf("%zu words, %zu lines\n", n, words.size());
}
