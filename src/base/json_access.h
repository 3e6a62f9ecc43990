// Checked access to JSON that comes from outside kvsnap (an export archive's
// index, llama-server's replies, servers.json, a snapshot's INFO).
//
// nlohmann::json throws on a type mismatch (`.get<>`, `.value()`) and has
// undefined behaviour for `operator[]` on a missing key of a const object, so
// outside JSON is never read with those. JsonRef wraps a value together with
// the name of its document and the key path that led to it, and every getter
// returns a Result whose error names all three and the type it found:
//   "export index: snapshots[3].uuid: expected a string, got number"
// A JsonRef does not own the value: the parsed document must outlive it.
#pragma once

#include "base/json.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvsnap {

// Parses `text` without exceptions, in time and memory linear in its size.
// kCorruption ("<doc>: not valid JSON[: why]") when it is not JSON, repeats a
// key within one object, or nests deeper than kMaxJsonDepth (code `code`
// instead, for documents whose badness is not a damaged file, e.g. a server's
// answer).
// Json: nlohmann::json, or nlohmann::ordered_json to keep the document's key order.
inline constexpr size_t kMaxJsonDepth = 256;
template <class Json = nlohmann::json>
Result<Json> parse_json(std::string_view text, const std::string& doc, Code code = Code::kCorruption);

template <class Json>
class BasicJsonRef {
 public:
  // `doc` names the document in messages ("export index", "servers.json").
  BasicJsonRef(const Json& value, std::string doc, Code code = Code::kCorruption)
      : v_(&value), doc_(std::move(doc)), code_(code) {}

  const Json& json() const { return *v_; }
  // "doc: a.b[3]" (or "doc" at the top).
  std::string where() const;

  // A required member of an object (error when this is no object or the key is absent).
  Result<BasicJsonRef> at(std::string_view key) const;
  // An optional member: nullopt when absent or null; an error when this is no object.
  Result<std::optional<BasicJsonRef>> find(std::string_view key) const;
  // The elements of an array (error when this is no array).
  Result<std::vector<BasicJsonRef>> elements() const;
  // The elements of an array, each through `parse` (BasicJsonRef -> Result<T>); the first error wins.
  template <class T, class Parse>
  Result<std::vector<T>> elements_as(Parse&& parse) const {
    KV_ASSIGN_OR_RETURN(std::vector<BasicJsonRef> elements, this->elements());
    std::vector<T> out;
    out.reserve(elements.size());
    for (const BasicJsonRef& e : elements) {
      KV_ASSIGN_OR_RETURN(T value, parse(e));
      out.push_back(std::move(value));
    }
    return out;
  }
  // The members of an object, in the document's order (error when this is no object).
  Result<std::vector<std::pair<std::string, BasicJsonRef>>> members() const;

  // This value as a type (error on any other type or out of range).
  Result<std::string> string() const;
  Result<bool> boolean() const;
  Result<int64_t> integer(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  Result<uint64_t> unsigned_integer(uint64_t max = UINT64_MAX) const;
  Result<double> number() const;  // any number

  // Required members of a type (error when absent, null or of another type).
  Result<std::string> string_at(std::string_view key) const;
  Result<uint64_t> unsigned_at(std::string_view key, uint64_t max = UINT64_MAX) const;

  // Optional members with a default when absent or null; a wrong type is still an error.
  Result<std::string> string_or(std::string_view key, std::string fallback) const;
  Result<bool> boolean_or(std::string_view key, bool fallback) const;
  Result<int64_t> integer_or(std::string_view key, int64_t fallback, int64_t min = INT64_MIN,
                             int64_t max = INT64_MAX) const;
  Result<uint64_t> unsigned_or(std::string_view key, uint64_t fallback, uint64_t max = UINT64_MAX) const;
  Result<double> number_or(std::string_view key, double fallback) const;

  // The error for this value: "<where>: <problem>".
  Status error(const std::string& problem) const;

 private:
  BasicJsonRef(const Json& value, std::string doc, std::string path, Code code)
      : v_(&value), doc_(std::move(doc)), path_(std::move(path)), code_(code) {}
  BasicJsonRef child(const Json& value, std::string_view key) const;
  Status expected(const char* what) const;

  const Json* v_;
  std::string doc_;
  std::string path_;
  Code code_;
};

// The text of `j` (indent < 0: one line), never throwing: strings that are not valid UTF-8 (a
// file name, a tag, a path from the file system) are written with U+FFFD for the bad bytes, where
// nlohmann's default dump() throws type_error 316. Every JSON kvsnap writes goes through here.
template <class Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::detail::error_handler_t::replace);
}

// An object of `pairs` in their order (a repeated key keeps its first place and its last value,
// as operator[] would), built in time linear in their number: operator[] on an ordered_json
// searches every earlier key, n^2 / 2 for an object of n (an mlx-lm file's metadata).
nlohmann::ordered_json ordered_object_of(const std::vector<std::pair<std::string, std::string>>& pairs);

using JsonRef = BasicJsonRef<nlohmann::json>;
using OrderedJsonRef = BasicJsonRef<nlohmann::ordered_json>;

extern template Result<nlohmann::json> parse_json<nlohmann::json>(std::string_view, const std::string&, Code);
extern template Result<nlohmann::ordered_json> parse_json<nlohmann::ordered_json>(std::string_view, const std::string&, Code);
extern template class BasicJsonRef<nlohmann::json>;
extern template class BasicJsonRef<nlohmann::ordered_json>;

}  // namespace kvsnap
