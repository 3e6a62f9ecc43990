#include "base/json_access.h"

#include <unordered_map>
#include <unordered_set>

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

// Builds the document from nlohmann's SAX events, in time linear in its size.
// nlohmann's own DOM parser inserts each key through the object's operator[],
// which for ordered_json (a vector) searches every earlier key: an object of a
// million keys took hours. Here a key is appended after one hash lookup, a
// repeated key is refused (nlohmann would keep the last silently: two readers
// of one document could disagree), and nesting is bounded, because dump() and
// every reader that walks a document recurse.
template <class Json>
class DomBuilder : public nlohmann::json_sax<Json> {
 public:
  using typename nlohmann::json_sax<Json>::number_integer_t;
  using typename nlohmann::json_sax<Json>::number_unsigned_t;
  using typename nlohmann::json_sax<Json>::number_float_t;
  using typename nlohmann::json_sax<Json>::string_t;
  using typename nlohmann::json_sax<Json>::binary_t;

  Json& root() { return root_; }
  // Why the parse stopped; empty for plain invalid JSON.
  const std::string& problem() const { return problem_; }

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(Json(v)); }
  bool string(string_t& v) override { return put(Json(std::move(v))); }
  bool binary(binary_t&) override { return false; }  // not in JSON text
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (!open_.back().keys.insert(k).second) {
      problem_ = "key '" + k + "' appears twice in one object";
      return false;
    }
    auto& object = open_.back().value->template get_ref<typename Json::object_t&>();
    if constexpr (requires { object.emplace_back(k, nullptr); }) {
      object.emplace_back(std::move(k), nullptr);  // ordered_map: no search, the key is new
      slot_ = &object.back().second;
    } else {
      slot_ = &object.emplace(std::move(k), nullptr).first->second;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Open {
    Json* value;
    std::unordered_set<std::string> keys;  // an object's keys so far
  };

  // Places `v` where the document expects the next value; its address (stable
  // until the next value is placed in the same container).
  Json* place(Json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *open_.back().value;
    if (parent.is_array()) {
      auto& array = parent.template get_ref<typename Json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool put(Json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    if (open_.size() >= kMaxJsonDepth) {
      problem_ = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    open_.push_back({place(std::move(container)), {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  Json root_;
  std::vector<Open> open_;
  Json* slot_ = nullptr;  // the value of the object key just read
  std::string problem_;
};

template <class Json>
Result<Json> parse_json(std::string_view text, const std::string& doc, Code code) {
  DomBuilder<Json> builder;
  if (!Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json, /*strict=*/true)) {
    return status_of(code, doc + ": not valid JSON" + (builder.problem().empty() ? "" : ": " + builder.problem()));
  }
  return std::move(builder.root());
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

nlohmann::ordered_json ordered_object_of(const std::vector<std::pair<std::string, std::string>>& pairs) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  auto& object = j.get_ref<nlohmann::ordered_json::object_t&>();
  std::unordered_map<std::string, size_t> at;
  for (const auto& [k, v] : pairs) {
    const auto [it, fresh] = at.emplace(k, object.size());
    if (fresh) {
      object.emplace_back(k, v);
    } else {
      (object.begin() + std::ptrdiff_t(it->second))->second = v;  // ordered_map's [] takes a key
    }
  }
  return j;
}

template Result<nlohmann::json> parse_json<nlohmann::json>(std::string_view, const std::string&, Code);
template Result<nlohmann::ordered_json> parse_json<nlohmann::ordered_json>(std::string_view, const std::string&, Code);
template class BasicJsonRef<nlohmann::json>;
template class BasicJsonRef<nlohmann::ordered_json>;

}  // namespace kvsnap

// base/json.h: the one compiled copy of nlohmann's serializer.
template class nlohmann::detail::serializer<nlohmann::json>;
template class nlohmann::detail::serializer<nlohmann::ordered_json>;
