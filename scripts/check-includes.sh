#!/usr/bin/env bash
# The dependency rule of docs/architecture.md ("Dependency rule"), checked on every #include "..."
# of common/ and services/: fails (exit 1) naming the file, the line and the rule on an include
# that the rule does not allow; a ctest (dependency_rule) runs it.
#   scripts/check-includes.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# What each folder of common/ may include besides itself (a lower layer only): a folder, or one
# header of a folder (folder/file.h).
declare -A allowed=(
  [base]=""
  [jinja]="base"
  [tokenizer]="base"
  [metrics]="base"
  [rpc]="base"
  [kernels]="base"
  [device]="base"
  [batching]="base"
  [transport]="base batching"
  [config]="base rpc transport/transport.h"
  [model]="base config"
  [run]="base config model"
  [plan]="base config model run transport/transport.h"
  [data]="base batching config jinja tokenizer"
  [nn]="base config kernels model"
  [drafter]="base config kernels model nn"
  [spec]="base drafter nn"
  [train]="base batching config data drafter model nn plan run transport"
)
# What each folder of services/ may include of services/ besides itself (all may include common/).
declare -A services_allowed=(
  [coordinator]="" [dflashctl]="" [worker_common]=""
  [target_worker]="worker_common" [drafter_worker]="worker_common"
)

violations=0
fail() { echo "check-includes: $1:$2: $3" >&2; violations=$((violations + 1)); }
while IFS= read -r -d '' file; do
  top=${file%%/*}
  rest=${file#*/}
  folder=${rest%%/*}
  while IFS=: read -r line include; do
    target_top=${include%%/*}
    target_rest=${include#*/}
    target=${target_rest%%/*}
    if [ "$top" = common ]; then
      if [ "$target_top" = services ] || [ "$target_top" = tests ]; then
        fail "$file" "$line" "common/ never includes $target_top/ (\"$include\")"
      elif [ "$target_top" = common ] && [ "$target" != "$folder" ]; then
        if [ -z "${allowed[$folder]+x}" ]; then
          fail "$file" "$line" "common/$folder/ is not in the rule: add it (docs/architecture.md)"
        elif [[ " ${allowed[$folder]} " != *" $target "* &&
                " ${allowed[$folder]} " != *" $target_rest "* ]]; then
          fail "$file" "$line" "common/$folder/ may include only: ${allowed[$folder]:-nothing}; not common/$target/ (\"$include\")"
        fi
      fi
    elif [ "$top" = services ]; then
      if [ "$target_top" = tests ]; then
        fail "$file" "$line" "services/ never includes tests/ (\"$include\")"
      elif [ "$target_top" = services ] && [ "$target" != "$folder" ]; then
        if [[ " ${services_allowed[$folder]:-} " != *" $target "* ]]; then
          fail "$file" "$line" "services/$folder/ may not include services/$target/ (\"$include\")"
        fi
      fi
    fi
  done < <(grep -n -o -E '^#include "[a-z_]+/[^"]+"' "$file" | sed -E 's/:#include "/:/; s/"$//')
done < <(find common services -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0)
if [ "$violations" = 0 ]; then
  echo "check-includes: every include of common/ and services/ follows the rule"
  exit 0
fi
echo "check-includes: $violations violation(s) of the dependency rule (docs/architecture.md)" >&2
exit 1
