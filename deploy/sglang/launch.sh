#!/usr/bin/env bash
# Start one of the two SGLang servers specroute routes between, from a node env file.
#
#   launch.sh spec|base [--env FILE] [--topology partitioned|shared|node] [--print]
#
# Settings come from the environment (systemd's EnvironmentFile=) or from --env FILE, which
# is sourced; --topology overrides TOPOLOGY. --print writes the final command line, shell
# quoted, instead of running it: the deployment test parses exactly that line with SGLang's
# own argument parser, so what is checked is what runs.
set -euo pipefail

usage() {
    echo "usage: $0 spec|base [--env FILE] [--topology partitioned|shared|node] [--print]" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
role=$1
shift
[[ $role == spec || $role == base ]] || usage
print=0
topology_flag=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --env) [[ $# -ge 2 ]] || usage; set -a; . "$2"; set +a; shift 2 ;;
        --topology) [[ $# -ge 2 ]] || usage; topology_flag=$2; shift 2 ;;
        --print) print=1; shift ;;
        *) usage ;;
    esac
done
TOPOLOGY=${topology_flag:-${TOPOLOGY:-partitioned}}

need() {
    local name
    for name in "$@"; do
        [[ -n ${!name:-} ]] || { echo "$0: $name is not set (see deploy/sglang/*.env)" >&2; exit 2; }
    done
}
need SGLANG_PYTHON MODEL_PATH HOST SPEC_PORT BASE_PORT MAX_RUNNING CUDA_GRAPH_MAX_BS

# The two servers differ only in speculation: the same cap on running requests and the same
# largest CUDA-graph batch, or the router's crossover compares queues and eager fallbacks
# (an EAGLE server left unset caps itself at 48 running requests).
# /v1/loads, which the router reads for load, is a snapshot published every 15 decode steps
# unless told otherwise: every step keeps it current.
args=(-m sglang.launch_server
    --model-path "$MODEL_PATH"
    --host "$HOST"
    --enable-metrics
    --load-snapshot-publish-interval 1
    --max-running-requests "$MAX_RUNNING"
    --cuda-graph-max-bs-decode "$CUDA_GRAPH_MAX_BS")
[[ -z ${SERVED_MODEL_NAME:-} ]] || args+=(--served-model-name "$SERVED_MODEL_NAME")
[[ ${TRUST_REMOTE_CODE:-0} != 1 ]] || args+=(--trust-remote-code)

if [[ $role == spec ]]; then
    need DRAFT_PATH SPEC_NUM_STEPS SPEC_EAGLE_TOPK SPEC_NUM_DRAFT_TOKENS
    args+=(--port "$SPEC_PORT"
        --speculative-algorithm EAGLE3
        --speculative-draft-model-path "$DRAFT_PATH"
        --speculative-num-steps "$SPEC_NUM_STEPS"
        --speculative-eagle-topk "$SPEC_EAGLE_TOPK"
        --speculative-num-draft-tokens "$SPEC_NUM_DRAFT_TOKENS")
    gpus=${SPEC_GPUS:-0,1,2,3}
    nccl_port=${SPEC_NCCL_PORT:-}
    extra=${SPEC_EXTRA_ARGS:-}
else
    args+=(--port "$BASE_PORT")
    gpus=${BASE_GPUS:-4,5,6,7}
    nccl_port=${BASE_NCCL_PORT:-}
    extra=${BASE_EXTRA_ARGS:-}
fi
# Fixed NCCL ports: two servers started together on one node could pick the same free one.
[[ -z $nccl_port ]] || args+=(--nccl-port "$nccl_port")

case $TOPOLOGY in
    partitioned)
        # each server owns half the node: tensor parallel over its own four GPUs
        need PARTITIONED_TP
        args+=(--tp-size "$PARTITIONED_TP")
        ;;
    shared)
        # both servers on every GPU; each reserves its fraction of memory, so the second to
        # start must find the first one's share already taken (see deploy/README.md)
        fraction=${role^^}_MEM_FRACTION_STATIC
        need SHARED_TP "$fraction"
        gpus=${ALL_GPUS:-0,1,2,3,4,5,6,7}
        args+=(--tp-size "$SHARED_TP" --mem-fraction-static "${!fraction}")
        ;;
    node)
        # a model too large to load twice on one node: each server gets a node of its own
        need SHARED_TP
        gpus=${ALL_GPUS:-0,1,2,3,4,5,6,7}
        args+=(--tp-size "$SHARED_TP")
        ;;
    *)
        echo "$0: TOPOLOGY must be partitioned, shared or node, not '$TOPOLOGY'" >&2
        exit 2
        ;;
esac

# word splitting of EXTRA_ARGS is wanted: they are flags, one word each
# shellcheck disable=SC2206
args+=(${EXTRA_ARGS:-} $extra)

if [[ $print == 1 ]]; then
    printf 'CUDA_VISIBLE_DEVICES=%q %q' "$gpus" "$SGLANG_PYTHON"
    printf ' %q' "${args[@]}"
    printf '\n'
else
    export CUDA_VISIBLE_DEVICES=$gpus
    exec "$SGLANG_PYTHON" "${args[@]}"
fi
