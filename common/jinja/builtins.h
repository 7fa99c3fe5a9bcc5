// The filters, tests, methods of str / dict / list objects and global functions that chat templates
// use, with the semantics of jinja2 3.1 under transformers (tojson is json.dumps with
// ensure_ascii=False; raise_exception and strftime_now are globals). Unknown names are refused at
// parse time (IsFilter / IsTest), so a template that needs more fails before rendering.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/value.h"

namespace dflash::jinja {

bool IsFilter(absl::string_view name);
bool IsTest(absl::string_view name);

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& subject,
                                  const CallArgs& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& subject, const CallArgs& args);

// obj.name(args) for a built-in method of str, dict or list. NotFound when `obj` has no such
// method (the caller then reports that the object is not callable).
absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, const CallArgs& args);

// range, namespace, dict, raise_exception, strftime_now.
ValueDict GlobalFunctions();

// The elements a for loop visits: list items, dict keys, str code points; undefined: none.
absl::StatusOr<ValueList> Iterate(const Value& v);

}  // namespace dflash::jinja
