#!/usr/bin/env bash
# A `slope serve --launcher` for the link-cut test (test_link_cut.py):
#   --launcher "bash tests/serve/netns_launcher.sh CLUSTER_SCRIPT {np}"
# An instance of 2 ranks runs across the namespaces of scripts/netns-cluster.sh (one rank per
# node, MPI over TCP on the veths only: CLUSTER_SCRIPT mpirun 1 -- ...); any other instance runs
# under plain mpirun in the root namespace. `exec` keeps mpirun the job the front watches.
set -euo pipefail
cluster="$1" np="$2"
shift 2
if [[ "$np" == 2 ]]; then
  exec bash "$cluster" mpirun 1 -- "$@"
fi
exec mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -np "$np" "$@"
