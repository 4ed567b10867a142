// tests/support/strict_json.hpp — a strict RFC 8259 JSON reader for the tests that write JSON
// (trace/'s Chrome traces, sim::chrome_trace): a malformed file fails in a test, not in a viewer.
//
//   const Json doc = JsonParser(text).document();   // throws std::runtime_error with the offset
//   doc["traceEvents"].array()[0]["name"].text();
#pragma once

#include <cctype>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace dtensor::testing {

struct Json;
using JsonObject = std::map<std::string, Json>;
using JsonArray = std::vector<Json>;
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, JsonArray, JsonObject> value;

  const Json& operator[](const std::string& key) const { return std::get<JsonObject>(value).at(key); }
  bool has(const std::string& key) const {
    const auto* o = std::get_if<JsonObject>(&value);
    return o && o->count(key);
  }
  const JsonArray& array() const { return std::get<JsonArray>(value); }
  const std::string& text() const { return std::get<std::string>(value); }
  double number() const { return std::get<double>(value); }
  bool boolean() const { return std::get<bool>(value); }
};

/// RFC 8259 JSON (no extensions); throws std::runtime_error at the first error, with its offset.
class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json document() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("text after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool take(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  void literal(const char* word) {
    for (const char* p = word; *p; ++p, ++i_)
      if (i_ >= s_.size() || s_[i_] != *p) fail(std::string("bad literal, expected ") + word);
  }
  Json value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return {string()};
    if (c == 't') return literal("true"), Json{true};
    if (c == 'f') return literal("false"), Json{false};
    if (c == 'n') return literal("null"), Json{nullptr};
    return {number()};
  }
  Json object() {
    expect('{');
    JsonObject o;
    if (take('}')) return {o};
    do {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
      std::string key = string();
      expect(':');
      if (!o.emplace(key, value()).second) fail("duplicate key " + key);
    } while (take(','));
    expect('}');
    return {o};
  }
  Json array() {
    expect('[');
    JsonArray a;
    if (take(']')) return {a};
    do a.push_back(value());
    while (take(','));
    expect(']');
    return {a};
  }
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      if (e == 'u') {
        for (int k = 0; k < 4; ++k, ++i_)
          if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) fail("bad \\u escape");
        out += '?';
      } else if (std::string("\"\\/bfnrt").find(e) != std::string::npos) {
        out += e;
      } else {
        fail("bad escape");
      }
    }
  }
  double number() {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == from) fail("expected a digit");
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') ++i_;
    else digits();
    if (i_ < s_.size() && s_[i_] == '.') ++i_, digits();
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      digits();
    }
    return std::stod(s_.substr(start, i_ - start));
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

}  // namespace dtensor::testing
