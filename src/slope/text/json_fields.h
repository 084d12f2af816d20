// Reading tokenizer.json fields with errors that name the component and the field.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"

namespace slope::text {

using json = nlohmann::json;

// j[key], which must exist and be non-null; `where` names the component ("normalizer Replace").
inline const json& required(const json& j, const char* key, const std::string& where) {
  SLOPE_CHECK(j.is_object() && j.contains(key) && !j.at(key).is_null(), "tokenizer.json: ", where, " has no '",
              key, "' field; the file is malformed or from an unsupported tokenizers version");
  return j.at(key);
}

template <typename T>
T get_or(const json& j, const char* key, const T& fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    fail("tokenizer.json: ", where, " field '", key, "' has the wrong type (", e.what(), ")");
  }
}

template <typename T>
T get_required(const json& j, const char* key, const std::string& where) {
  const json& v = required(j, key, where);
  try {
    return v.get<T>();
  } catch (const json::exception& e) {
    fail("tokenizer.json: ", where, " field '", key, "' has the wrong type (", e.what(), ")");
  }
}

// The "type" of a component object.
inline std::string type_of(const json& j, const std::string& where) {
  SLOPE_CHECK(j.is_object(), "tokenizer.json: ", where, " is not an object");
  return get_required<std::string>(j, "type", where);
}

}  // namespace slope::text
