#!/usr/bin/env bash
# Checks the layering of the source tree (README "Layout"): each folder of src/
# includes only its own headers and those of the layers below it, the core
# library's code never sees the model or eval headers, and the tools and
# benchmarks include public headers (include/) or their own folder only.
#   check_layers.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
bad=0 checked=0
# layer -> the private folders and public headers it may include
allowed() {
  case $1 in
    core)    echo "core kittykv.h kittykv_cpu.h" ;;
    quant)   echo "core quant kittykv.h kittykv_cpu.h" ;;
    kernels) echo "core quant kernels kittykv.h kittykv_cpu.h" ;;
    cache)   echo "core quant kernels cache kittykv.h kittykv_cpu.h" ;;
    model)   echo "core model kittykv.h kittykv_cpu.h kittykv_model.h" ;;
    eval)    echo "core eval kittykv.h kittykv_cpu.h kittykv_model.h kittykv_eval.h" ;;
    cuda)    echo "quant cuda kkv_cuda.h" ;;
  esac
}
for dir in src/*/; do
  layer=$(basename "$dir")
  ok=" $(allowed "$layer") "
  for f in "$dir"*.[ch] "$dir"*.cu; do
    [ -f "$f" ] || continue
    while IFS= read -r inc; do
      checked=$((checked + 1))
      top=${inc%%/*}
      [ "$top" = "$inc" ] && top=$inc            # a bare header name
      if [[ "$ok" != *" $top "* ]]; then
        echo "layering: $f includes \"$inc\" (layer $layer may include: $(allowed "$layer"))"
        bad=$((bad + 1))
      fi
    done < <(grep -hoE '^#include "[^"]+"' "$f" | sed 's/#include "//; s/"$//')
  done
done
for f in $(find tools bench -name '*.[ch]'); do
  d=$(dirname "$f")
  while IFS= read -r inc; do
    checked=$((checked + 1))
    if [ ! -f "include/$inc" ] && [ ! -f "$d/$inc" ]; then
      echo "layering: $f includes \"$inc\", which is neither public nor its own"
      bad=$((bad + 1))
    fi
  done < <(grep -hoE '^#include "[^"]+"' "$f" | sed 's/#include "//; s/"$//')
done
# The public headers: the core header stands alone; each includes only those below it.
for pair in "kittykv.h:" "kittykv_cpu.h:kittykv.h" "kittykv_model.h:kittykv.h kittykv_cpu.h" \
            "kittykv_eval.h:kittykv.h kittykv_cpu.h kittykv_model.h"; do
  h=${pair%%:*} may=" ${pair#*:} "
  while IFS= read -r inc; do
    checked=$((checked + 1))
    [[ "$may" == *" $inc "* ]] || { echo "layering: include/$h includes \"$inc\""; bad=$((bad + 1)); }
  done < <(grep -hoE '^#include "[^"]+"' "include/$h" | sed 's/#include "//; s/"$//')
done
echo "$((checked - bad)) passed, $bad failed"
[ "$bad" = 0 ]
