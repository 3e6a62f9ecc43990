#include "base/json_access.h"

namespace kvsnap {

namespace {

Status status_of(Code code, std::string msg) {
  switch (code) {
    case Code::kNotSupported: return Status::NotSupported(std::move(msg));
    case Code::kInvalidArgument: return Status::InvalidArgument(std::move(msg));
    case Code::kIOError: return Status::IOError(std::move(msg));
    case Code::kNotFound: return Status::NotFound(std::move(msg));
    case Code::kMismatch: return Status::Mismatch(std::move(msg));
    case Code::kAmbiguous: return Status::Ambiguous(std::move(msg));
    case Code::kInterrupted: return Status::Interrupted(std::move(msg));
    case Code::kOk:  // an error is wanted: a damaged document
    case Code::kCorruption: break;
  }
  return Status::Corruption(std::move(msg));
}

}  // namespace

template <class Json>
Result<Json> parse_json(std::string_view text, const std::string& doc, Code code) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return status_of(code, doc + ": not valid JSON");
  return j;
}

template <class Json>
std::string BasicJsonRef<Json>::where() const {
  return path_.empty() ? doc_ : doc_ + ": " + path_;
}

template <class Json>
Status BasicJsonRef<Json>::error(const std::string& problem) const {
  return status_of(code_, where() + ": " + problem);
}

template <class Json>
Status BasicJsonRef<Json>::expected(const char* what) const {
  return error(std::string("expected ") + what + ", got " + v_->type_name());
}

template <class Json>
BasicJsonRef<Json> BasicJsonRef<Json>::child(const Json& value, std::string_view key) const {
  std::string path = path_;
  if (!key.empty() && key.front() == '[') {
    path += key;
  } else {
    if (!path.empty()) path += '.';
    path += key;
  }
  return BasicJsonRef(value, doc_, std::move(path), code_);
}

template <class Json>
Result<BasicJsonRef<Json>> BasicJsonRef<Json>::at(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  if (!m) {
    const auto it = v_->find(std::string(key));
    if (it == v_->end()) return error("no \"" + std::string(key) + "\"");
    return child(*it, key).expected("a value");  // present but null
  }
  return *m;
}

template <class Json>
Result<std::optional<BasicJsonRef<Json>>> BasicJsonRef<Json>::find(std::string_view key) const {
  if (!v_->is_object()) return expected("an object");
  const auto it = v_->find(std::string(key));
  if (it == v_->end() || it->is_null()) return std::optional<BasicJsonRef>();
  return std::optional<BasicJsonRef>(child(*it, key));
}

template <class Json>
Result<std::vector<BasicJsonRef<Json>>> BasicJsonRef<Json>::elements() const {
  if (!v_->is_array()) return expected("an array");
  std::vector<BasicJsonRef> out;
  out.reserve(v_->size());
  for (size_t i = 0; i < v_->size(); ++i) out.push_back(child((*v_)[i], "[" + std::to_string(i) + "]"));
  return out;
}

template <class Json>
Result<std::vector<std::pair<std::string, BasicJsonRef<Json>>>> BasicJsonRef<Json>::members() const {
  if (!v_->is_object()) return expected("an object");
  std::vector<std::pair<std::string, BasicJsonRef>> out;
  for (auto it = v_->begin(); it != v_->end(); ++it) out.emplace_back(it.key(), child(it.value(), it.key()));
  return out;
}

template <class Json>
Result<std::string> BasicJsonRef<Json>::string() const {
  if (!v_->is_string()) return expected("a string");
  return v_->template get_ref<const std::string&>();
}

template <class Json>
Result<bool> BasicJsonRef<Json>::boolean() const {
  if (!v_->is_boolean()) return expected("a boolean");
  return v_->template get<bool>();
}

template <class Json>
Result<int64_t> BasicJsonRef<Json>::integer(int64_t min, int64_t max) const {
  const std::string range = " in " + std::to_string(min) + ".." + std::to_string(max);
  if (!v_->is_number_integer()) return expected(("an integer" + range).c_str());
  if (v_->is_number_unsigned()) {
    const uint64_t u = v_->template get<uint64_t>();
    // nlohmann parses every non-negative literal as unsigned: min applies here too (integer(1, N) and 0).
    if (max < 0 || u > uint64_t(max) || (min > 0 && u < uint64_t(min))) return error(std::to_string(u) + " is out of range (expected" + range + ")");
    return int64_t(u);
  }
  const int64_t i = v_->template get<int64_t>();
  if (i < min || i > max) return error(std::to_string(i) + " is out of range (expected" + range + ")");
  return i;
}

template <class Json>
Result<uint64_t> BasicJsonRef<Json>::unsigned_integer(uint64_t max) const {
  if (!v_->is_number_unsigned()) return expected("a non-negative integer");
  const uint64_t u = v_->template get<uint64_t>();
  if (u > max) return error(std::to_string(u) + " is out of range (at most " + std::to_string(max) + ")");
  return u;
}

template <class Json>
Result<double> BasicJsonRef<Json>::number() const {
  if (!v_->is_number()) return expected("a number");
  return v_->template get<double>();
}

template <class Json>
Result<std::string> BasicJsonRef<Json>::string_at(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(BasicJsonRef m, at(key));
  return m.string();
}

template <class Json>
Result<uint64_t> BasicJsonRef<Json>::unsigned_at(std::string_view key, uint64_t max) const {
  KV_ASSIGN_OR_RETURN(BasicJsonRef m, at(key));
  return m.unsigned_integer(max);
}

// The *_or getters: absent or null gives the fallback, anything else must have the type.
template <class Json>
Result<std::string> BasicJsonRef<Json>::string_or(std::string_view key, std::string fallback) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  return m ? m->string() : Result<std::string>(std::move(fallback));
}

template <class Json>
Result<bool> BasicJsonRef<Json>::boolean_or(std::string_view key, bool fallback) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  return m ? m->boolean() : Result<bool>(fallback);
}

template <class Json>
Result<int64_t> BasicJsonRef<Json>::integer_or(std::string_view key, int64_t fallback, int64_t min,
                                               int64_t max) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  return m ? m->integer(min, max) : Result<int64_t>(fallback);
}

template <class Json>
Result<uint64_t> BasicJsonRef<Json>::unsigned_or(std::string_view key, uint64_t fallback, uint64_t max) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  return m ? m->unsigned_integer(max) : Result<uint64_t>(fallback);
}

template <class Json>
Result<double> BasicJsonRef<Json>::number_or(std::string_view key, double fallback) const {
  KV_ASSIGN_OR_RETURN(std::optional<BasicJsonRef> m, find(key));
  return m ? m->number() : Result<double>(fallback);
}

template Result<nlohmann::json> parse_json<nlohmann::json>(std::string_view, const std::string&, Code);
template Result<nlohmann::ordered_json> parse_json<nlohmann::ordered_json>(std::string_view, const std::string&, Code);
template class BasicJsonRef<nlohmann::json>;
template class BasicJsonRef<nlohmann::ordered_json>;

}  // namespace kvsnap
