#!/usr/bin/env bash
# Multi-node GRPO with a token-level credit method on SLURM: the last node serves generations with vLLM
# (`trl vllm-serve`), the other nodes train with accelerate (DeepSpeed ZeRO-3 by default) and pull completions
# from it, pushing their weights to it over NCCL after each optimizer step.
#
#   sbatch --nodes=5 examples/slurm_multinode.sh                                   # TIDE, Qwen2.5-32B recipe
#   RECIPE=configs/taco_qwen3_1.7b_base.yaml MODEL=Qwen/Qwen3-1.7B-Base sbatch --nodes=2 examples/slurm_multinode.sh
#   DRY_RUN=1 NODELIST="n1 n2 n3" bash examples/slurm_multinode.sh                # print the commands, run nothing
#   LAUNCH=local NODELIST="127.0.0.1 127.0.0.1 127.0.0.1" bash examples/slurm_multinode.sh   # every node here
#
# Every extra argument is passed on to `trl-credit grpo` (e.g. `--max_steps 200 --output_dir runs/tide32b`); the options
# the script sets itself (model, vLLM server, accelerate config) come from the variables below, given once.
# Needs, on every node: this package with the `vllm` extra (vLLM <= 0.31 pins transformers < 5.18) and, for ZeRO,
# the `deepspeed` extra; a shared file system for the output directory; the model in the local HF cache or a path.
#
# The output directory is one run's: the launcher of each training node checks its lock (docs/scaling.md,
# "Multi-node"), and all of them are given this job's TRL_CREDIT_JOB_ID, so they are accepted as one job while a
# launcher of any other job into that directory is refused.
#
# LAUNCH=local runs each node's command in the background on this machine instead of through `srun` (NODELIST:
# addresses of this machine, e.g. 127.0.0.1), each in a session of its own whose process id is written to
# $RUN_DIR/machine<rank>.pid; tests/real_vllm/test_multinode.py runs the recipe so, on CPU, with GPUS_PER_NODE=1,
# a CPU accelerate config as ACCELERATE_BASE and VLLM_ARGS="--gpu_memory_utilization 0.1 --dtype float32
# --enforce_eager true".
#
#SBATCH --job-name=trl-credit
#SBATCH --nodes=5
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --output=%x-%j.out

set -euo pipefail

METHOD=${METHOD:-}                         # empty: the recipe's method (a flag naming another one is refused)
RECIPE=${RECIPE:-configs/tide_qwen2.5_32b_zero3.yaml}
MODEL=${MODEL:-Qwen/Qwen2.5-32B}
ACCELERATE_BASE=${ACCELERATE_BASE:-configs/accelerate/zero3.yaml}  # or zero2.yaml, fsdp2.yaml
GPUS_PER_NODE=${GPUS_PER_NODE:-8}          # training processes per node
VLLM_TP=${VLLM_TP:-$GPUS_PER_NODE}        # vLLM tensor parallelism on the server node (TP x DP <= its GPUs)
VLLM_DP=${VLLM_DP:-1}
VLLM_PORT=${VLLM_PORT:-8000}
VLLM_GROUP_PORT=${VLLM_GROUP_PORT:-51216}  # NCCL weight-sync group between trainer rank 0 and the server
VLLM_ARGS=${VLLM_ARGS:-}                   # more `trl vllm-serve` flags, split on spaces
VLLM_SERVER_TIMEOUT=${VLLM_SERVER_TIMEOUT:-1800}  # seconds TRL waits for the server to come up
MAIN_PORT=${MAIN_PORT:-29500}
RUN_DIR=${RUN_DIR:-runs/${SLURM_JOB_ID:-local}}
LAUNCH=${LAUNCH:-srun}                     # srun, or local (every node's command here, in the background)
# One value for every launcher of this job: they train into one output directory as one job (its lock).
export TRL_CREDIT_JOB_ID=${TRL_CREDIT_JOB_ID:-${SLURM_JOB_ID:-$(hostname)-$$-$(date +%s)}}

if [[ "$LAUNCH" != srun && "$LAUNCH" != local ]]; then
    echo "slurm_multinode.sh: LAUNCH must be srun or local, got '$LAUNCH'" >&2
    exit 2
fi
if [[ -n "${NODELIST:-}" ]]; then
    read -r -a NODES <<< "$NODELIST"
else
    mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
fi
NUM_NODES=${#NODES[@]}
if (( NUM_NODES < 2 )); then
    echo "slurm_multinode.sh: needs at least 2 nodes (1 vLLM server + training nodes), got $NUM_NODES" >&2
    exit 2
fi
VLLM_NODE=${NODES[NUM_NODES-1]}
TRAIN_NODES=("${NODES[@]:0:NUM_NODES-1}")
NUM_TRAIN_NODES=${#TRAIN_NODES[@]}
MAIN_NODE=${TRAIN_NODES[0]}
TRAIN_NODE_LIST=$(IFS=,; echo "${TRAIN_NODES[*]}")
mkdir -p "$RUN_DIR"
read -r -a VLLM_EXTRA <<< "$VLLM_ARGS"

run() {  # run a command, or print it with DRY_RUN=1
    if [[ -n "${DRY_RUN:-}" ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

serve_on() {  # $1 = node, then the server's command, in the background: there through srun, or (LAUNCH=local)
    local node=$1  #  here, as the leader of a session of its own (the background job becomes the server itself)
    shift
    if [[ -n "${DRY_RUN:-}" ]]; then
        run srun --nodes=1 --ntasks=1 --nodelist="$node" "$@"
    elif [[ "$LAUNCH" == local ]]; then
        exec setsid "$@"
    else
        exec srun --nodes=1 --ntasks=1 --nodelist="$node" "$@"
    fi
}

# 1. The vLLM server (weights are pushed by the trainer; `trl vllm-serve` sets --logprobs-mode processed_logprobs,
#    which TRL's importance-sampling correction needs).
serve_on "$VLLM_NODE" trl vllm-serve --model "$MODEL" --tensor_parallel_size "$VLLM_TP" \
    --data_parallel_size "$VLLM_DP" --host 0.0.0.0 --port "$VLLM_PORT" ${VLLM_EXTRA[@]+"${VLLM_EXTRA[@]}"} &
server=$!

stop_server() {  # the server's srun step, or (local) its session: the server and the engine process it started
    if [[ "$LAUNCH" != local ]]; then
        kill "$server" 2>/dev/null || true
    else  # a server still starting up may not answer SIGTERM: SIGKILL after 15 s
        kill -TERM -- "-$server" 2>/dev/null || true
        for _ in {1..15}; do
            [[ "$(ps -o stat= -p "$server" 2>/dev/null)" =~ ^[^Z] ]] || break
            sleep 1
        done
        kill -KILL -- "-$server" 2>/dev/null || true
    fi
    wait "$server" 2>/dev/null || true
}

# 2. One accelerate config per training node: the base config plus the multi-node fields (machine_rank differs).
#    `trl-credit grpo --accelerate_config PATH` hands it to `accelerate launch --config_file`.
write_node_config() {  # $1 = machine rank
    python - "$ACCELERATE_BASE" "$RUN_DIR/accelerate_node$1.yaml" "$1" "$NUM_TRAIN_NODES" "$GPUS_PER_NODE" \
        "$MAIN_NODE" "$MAIN_PORT" <<'PY'
import sys, yaml
base, out, rank, nodes, gpus, host, port = sys.argv[1:]
config = yaml.safe_load(open(base))
config.update(machine_rank=int(rank), num_machines=int(nodes), num_processes=int(nodes) * int(gpus),
              main_process_ip=host, main_process_port=int(port), rdzv_backend="static", same_network=True)
yaml.safe_dump(config, open(out, "w"), sort_keys=True)
PY
}
export -f write_node_config
export ACCELERATE_BASE RUN_DIR NUM_TRAIN_NODES GPUS_PER_NODE MAIN_NODE MAIN_PORT

TRAIN_ARGS=(
    ${METHOD:+--method "$METHOD"} --config "$RECIPE" --model_name_or_path "$MODEL"
    --use_vllm --vllm_mode server --vllm_server_host "$VLLM_NODE" --vllm_server_port "$VLLM_PORT"
    --vllm_group_port "$VLLM_GROUP_PORT" --vllm_server_timeout "$VLLM_SERVER_TIMEOUT"
    "$@"
)
# What each training node runs, its machine rank in SLURM_PROCID: write its config, then launch.
NODE_COMMAND='write_node_config "$SLURM_PROCID" &&
              exec trl-credit grpo "$@" --accelerate_config "$RUN_DIR/accelerate_node$SLURM_PROCID.yaml"'

# 3. Training: one task per training node. TRL waits up to --vllm_server_timeout seconds for the server to come up.
if [[ -n "${DRY_RUN:-}" ]]; then
    write_node_config 0
    echo "# on each of $TRAIN_NODE_LIST (machine rank = SLURM_PROCID):"
    run trl-credit grpo "${TRAIN_ARGS[@]}" --accelerate_config "$RUN_DIR/accelerate_node0.yaml"
    wait
    exit 0
fi
status=0
machines=()
stop_machines() {  # (local) each machine's session: its launcher, and through it its training processes
    for pid in ${machines[@]+"${machines[@]}"}; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
trap 'stop_machines; stop_server; exit 143' TERM INT
if [[ "$LAUNCH" == local ]]; then
    for (( rank = 0; rank < NUM_TRAIN_NODES; rank++ )); do
        SLURM_PROCID=$rank setsid bash -c "$NODE_COMMAND" _ "${TRAIN_ARGS[@]}" &
        machines+=($!)
        echo "$!" > "$RUN_DIR/machine$rank.pid"
    done
    for pid in "${machines[@]}"; do
        wait "$pid" || { code=$?; (( status )) || status=$code; }
    done
else
    srun --nodes="$NUM_TRAIN_NODES" --ntasks="$NUM_TRAIN_NODES" --ntasks-per-node=1 --nodelist="$TRAIN_NODE_LIST" \
        bash -c "$NODE_COMMAND" _ "${TRAIN_ARGS[@]}" || status=$?
fi

# 4. Training is over: stop the server.
stop_server
exit "$status"
