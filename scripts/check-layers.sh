#!/usr/bin/env bash
# Data flows one way: HTTP API -> node -> control | cluster | clairvoyant ->
# partition, store, transport -> source. (control, the catalog's rules, sits
# beside cluster: the node holds both, the API calls both.) Each package may import only packages of a
# lower layer than its own; nothing imports a command. Fails naming every
# import that points up or sideways. (bench/ is a module of its own, above
# all of these; ./... does not reach it.)
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A layer=(
  [miniotest]=-1 [internal/testutil]=-1 [api]=0 [shmdir]=0 [handoff]=0 [bufpool]=0 [catchup]=0 [clusterauth]=0 [datadir]=0 [discovery]=0 [listen]=0 [logbridge]=0 [partition]=0 [source]=0 [store]=0
  [planner]=0 [split]=1
  [catalog]=1 [relay]=1 [transport]=1 [membership]=1
  [locality]=2 [internal/testcatalog]=2
  [cluster]=3 [clairvoyant]=3 [control]=3 [derived]=3
  [node]=4 [checkpoint]=4 [groups]=4
  [httpapi]=5 [client]=5
  [stall]=6 [internal/testcluster]=6
  [integration]=7
)
bad=0
while read -r pkg imports; do
  p=${pkg#stallfree/}
  case $p in cmd/*|bench/*) continue ;; esac
  if [ -z "${layer[$p]+x}" ]; then echo "check-layers: package $p has no layer; add it to $0"; bad=1; continue; fi
  for imp in $imports; do
    case $imp in stallfree/*) ;; *) continue ;; esac
    q=${imp#stallfree/}
    case $q in cmd/*) echo "check-layers: $p imports a command ($q)"; bad=1; continue ;; esac
    if [ -z "${layer[$q]+x}" ]; then echo "check-layers: package $q has no layer"; bad=1; continue; fi
    if (( layer[$q] >= layer[$p] )); then
      echo "check-layers: $p (layer ${layer[$p]}) imports $q (layer ${layer[$q]})"; bad=1
    fi
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}}' ./...)
exit $bad
