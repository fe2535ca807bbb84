#!/usr/bin/env bash
# Sets up a donated GPU node for kernelbot: one Buildkite agent per GPU (or per
# GPUS_PER_AGENT GPUs, for multi-GPU tasks), each a systemd service in its own cgroup slice
# (its GPUs' share of the node's CPUs and memory), tagged with the node's queue, and an
# environment hook that binds every job to the agent's GPUs, CPU set and memory.
# Idempotent: a second run with the same inputs changes nothing.
#
# Usage (as root):
#   BUILDKITE_AGENT_TOKEN=... QUEUE=h100 ./setup-node.sh
#
# Inputs (environment):
#   BUILDKITE_AGENT_TOKEN  agent registration token (required)
#   QUEUE                  Buildkite queue these GPUs serve, e.g. h100, b200, mi300 (required)
#   GPU_VENDOR             nvidia | amd (default: detected with nvidia-smi, then rocm-smi)
#   GPU_COUNT              GPUs to set up (default: all detected)
#   GPUS_PER_AGENT         GPUs each agent holds (default: 1); more than 1 for a queue of
#                          multi-GPU tasks, with the CPUs and memory of as many GPUs. It
#                          must divide the GPU count; the service's GPU_QUEUES says the same
#                          (e.g. MI300x8_BK=mi300x8:8)
#   NODE_CPUS              CPUs to divide (default: nproc)
#   NODE_MEMORY_GB         memory to divide, in GiB (default: from /proc/meminfo)
#   RESERVED_MEMORY_GB     memory kept for the host (default: 8)
#   PIDS_LIMIT             processes (and threads) one job's container may hold (default: 8192)
#   PAUSE_MINUTES          how long an agent whose GPU failed the runner's checks pauses
#                          itself (default: 240; at most 10080, Buildkite's limit)
#   REAL_DOCKER            the docker the wrapper runs (default: /usr/bin/docker)
#   RENDER_NODES           AMD: the render node of each GPU in index order, e.g.
#                          "renderD128 renderD129" (default: /dev/dri/renderD* by number)
#   NODE_NAME              agent name prefix (default: hostname)
#   ROOT                   write everything under this directory instead of / (for tests)
#   INSTALL                1: install buildkite-agent, Docker and the vendor's container
#                          toolkit if missing (default: 1 when ROOT is /, else 0)
#   START                  1: reload systemd and (re)start the agents (default as INSTALL)
set -euo pipefail

ROOT="${ROOT:-/}"
ROOT="${ROOT%/}"
live_default=0
[[ -z "$ROOT" ]] && live_default=1
INSTALL="${INSTALL:-$live_default}"
START="${START:-$live_default}"
RESERVED_MEMORY_GB="${RESERVED_MEMORY_GB:-8}"
GPUS_PER_AGENT="${GPUS_PER_AGENT:-1}"
PIDS_LIMIT="${PIDS_LIMIT:-8192}"
PAUSE_MINUTES="${PAUSE_MINUTES:-240}"
REAL_DOCKER="${REAL_DOCKER:-/usr/bin/docker}"
WRAPPER_DIR="/usr/local/lib/kernelbot/bin"
NODE_NAME="${NODE_NAME:-$(hostname -s 2>/dev/null || echo node)}"
AGENT_USER="buildkite-agent"
CHANGED=0

die() {
  echo "setup-node: $*" >&2
  exit 1
}

log() {
  echo "setup-node: $*"
}

# Writes $1 (mode $2) with stdin's content, only when the content or mode differs.
write_file() {
  local path="$ROOT$1" mode="$2" tmp
  tmp="$(mktemp)"
  cat >"$tmp"
  mkdir -p "$(dirname "$path")"
  if [[ -f "$path" ]] && cmp -s "$tmp" "$path" && [[ "$(stat -c %a "$path")" == "$mode" ]]; then
    rm -f "$tmp"
    return 0
  fi
  install -m "$mode" "$tmp" "$path"
  rm -f "$tmp"
  CHANGED=$((CHANGED + 1))
  log "wrote $1"
}

ensure_dir() {
  if [[ ! -d "$ROOT$1" ]]; then
    mkdir -p "$ROOT$1"
    CHANGED=$((CHANGED + 1))
    log "created $1"
  fi
}

detect_vendor() {
  if [[ -n "${GPU_VENDOR:-}" ]]; then
    echo "$GPU_VENDOR"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo nvidia
  elif command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname --json >/dev/null 2>&1; then
    echo amd
  else
    die "no GPU found (nvidia-smi and rocm-smi both failed); set GPU_VENDOR and GPU_COUNT"
  fi
}

detect_gpu_count() {
  local vendor="$1"
  if [[ -n "${GPU_COUNT:-}" ]]; then
    echo "$GPU_COUNT"
  elif [[ "$vendor" == nvidia ]]; then
    nvidia-smi -L | grep -c '^GPU '
  else
    rocm-smi --showproductname --json | grep -o '"card[0-9]*"' | sort -u | wc -l
  fi
}

# AMD: the render nodes, one per GPU in index order.
detect_render_nodes() {
  if [[ -n "${RENDER_NODES:-}" ]]; then
    echo "$RENDER_NODES"
  else
    find /dev/dri -maxdepth 1 -name 'renderD*' -printf '%f\n' 2>/dev/null | sort -V | tr '\n' ' '
  fi
}

detect_memory_gb() {
  if [[ -n "${NODE_MEMORY_GB:-}" ]]; then
    echo "$NODE_MEMORY_GB"
  else
    awk '/^MemTotal:/ { printf "%d\n", $2 / 1048576 }' /proc/meminfo
  fi
}

install_packages() {
  local vendor="$1"
  if ! command -v buildkite-agent >/dev/null 2>&1; then
    log "installing buildkite-agent"
    apt-get update
    apt-get install -y apt-transport-https gnupg curl
    curl -fsSL https://keys.openpgp.org/vks/v1/by-fingerprint/32A37959C2FA5C3C99EFBC32A79206696452D198 |
      gpg --dearmor -o /usr/share/keyrings/buildkite-agent-archive-keyring.gpg
    echo "deb [signed-by=/usr/share/keyrings/buildkite-agent-archive-keyring.gpg] https://apt.buildkite.com/buildkite-agent stable main" \
      >/etc/apt/sources.list.d/buildkite-agent.list
    apt-get update
    apt-get install -y buildkite-agent
  fi
  if ! command -v docker >/dev/null 2>&1; then
    log "installing Docker"
    apt-get install -y docker.io
  fi
  usermod -aG docker "$AGENT_USER"
  if [[ "$vendor" == nvidia ]]; then
    if ! command -v nvidia-ctk >/dev/null 2>&1; then
      log "installing the NVIDIA Container Toolkit"
      curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey |
        gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
      curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
        sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g' \
          >/etc/apt/sources.list.d/nvidia-container-toolkit.list
      apt-get update
      apt-get install -y nvidia-container-toolkit
      nvidia-ctk runtime configure --runtime=docker
      systemctl restart docker
    fi
  else
    # ROCm containers need no runtime: /dev/kfd and /dev/dri are passed to each job, and
    # the agent user must be allowed to open them.
    usermod -aG video,render "$AGENT_USER"
  fi
}

# The docker every job of this node calls (first on the agents' PATH). `docker run` (and
# `create`) is parsed the way docker reads the options the docker plugin emits (an option it
# does not know is refused) and gets what the plugin has no option for: the agent's CPU set
# and a pids limit, from the environment hook. Refused: privileges or capabilities beyond the
# runner's five, host or other containers' namespaces, another GPU or device, any mount but the
# job's own output directory, users, entrypoints, and `update`/`exec`/`compose`, which could
# change or enter a container afterwards. This guards against a mistaken pipeline; it is no
# boundary against whoever controls the agent (its user is in the docker group).
docker_wrapper() {
  cat <<WRAPPER
#!/usr/bin/env bash
# Generated by setup-node.sh: the docker kernelbot's agents call. See setup-node.sh.
set -euo pipefail
real="${REAL_DOCKER}"
WRAPPER
  cat <<'WRAPPER'
unset DOCKER_HOST DOCKER_CONTEXT
refuse() {
  echo "kernelbot docker wrapper: refusing $1" >&2
  exit 125
}
case "${1:-}" in
  run | create) sub="$1" && shift ;;
  container)
    case "${2:-}" in
      run | create) sub="$2" && shift 2 ;;
      update | exec) refuse "docker container $2" ;;
      *) exec "$real" "$@" ;;
    esac ;;
  update | exec | compose) refuse "docker $1" ;;
  -*) refuse "global options ($1)" ;;
  *) exec "$real" "$@" ;;
esac
[[ -n "${KERNELBOT_CPUSET:-}" ]] || refuse "a container without KERNELBOT_CPUSET (not set by the agent's hook)"
[[ "${KERNELBOT_PIDS_LIMIT:-}" =~ ^[1-9][0-9]*$ ]] || refuse "a container without a KERNELBOT_PIDS_LIMIT"
# The plugin expands `./kernelbot-out` to `$PWD//kernelbot-out`.
out_dirs=("$PWD/kernelbot-out:/out" "$PWD//kernelbot-out:/out")
check() {
  local opt="$1" value="$2"
  case "$opt" in
    --cap-add)
      value="${value^^}"
      case "${value#CAP_}" in CHOWN | DAC_OVERRIDE | KILL | SETGID | SETUID) ;; *) refuse "$opt $2" ;; esac ;;
    --pid | --network | --ipc)
      [[ "$value" != host && "$value" != container:* ]] || refuse "$opt $value" ;;
    --security-opt)
      [[ "$value" == no-new-privileges || "$value" == no-new-privileges:true ]] || refuse "$opt $value" ;;
    -v | --volume)
      [[ "$value" == "${out_dirs[0]}" || "$value" == "${out_dirs[1]}" ]] || refuse "$opt $value" ;;
    --device)
      [[ "$value" == /dev/kfd || ("$value" =~ ^/dev/dri/renderD[0-9]+$ && " ${KERNELBOT_RENDER_NODES:-} " == *" ${value#/dev/dri/} "*) ]] || refuse "$opt $value" ;;
    --gpus)
      # Several devices are quoted, as docker reads them: "device=0,1".
      [[ "$value" == "device=${KERNELBOT_GPUS:-none}" || "$value" == "\"device=${KERNELBOT_GPUS:-none}\"" ]] || refuse "$opt $value" ;;
    -e | --env)
      [[ "$value" != NVIDIA_VISIBLE_DEVICES* ]] || refuse "$opt $value" ;;
    --runtime)
      [[ "$value" == nvidia ]] || refuse "$opt $value" ;;
    # Values that change nothing the node relies on.
    --stop-timeout | --cap-drop | --ulimit | -w | --workdir | --platform | --storage-opt | --log-driver | --log-opt | --shm-size | --cpus | --memory | --memory-swap | --memory-swappiness | -l | --label | --name | --hostname | --device-read-bps | --device-write-bps | --device-read-iops | --device-write-iops) ;;
    *) refuse "$opt (an option this wrapper does not know)" ;;
  esac
}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  arg="${args[i]}"
  case "$arg" in
    -t | -i | -it | -ti | --tty | --interactive | --rm | --init | --read-only) ;;
    --) break ;;
    --*=*) check "${arg%%=*}" "${arg#*=}" ;;
    -*)
      check "$arg" "${args[i + 1]:-}"
      i=$((i + 1)) ;;
    *) break ;; # the image: what follows is the container's command
  esac
done
exec "$real" "$sub" --cpuset-cpus="$KERNELBOT_CPUSET" --pids-limit="$KERNELBOT_PIDS_LIMIT" "$@"
WRAPPER
}

# "0,1,...,$1-1": how the container numbers the agent's $1 devices.
container_devices() {
  local n="$1" i out=0
  for ((i = 1; i < n; i++)); do out+=",$i"; done
  echo "$out"
}

# The environment hook for agent $1 (named by its first GPU) holding the GPUs $2 ("0" or
# "0,1,2,3"): GPU binding, the KERNELBOT_* resources, and the docker plugin's gpus/devices,
# cpus and memory (the plugin reads its options from these variables; the pipeline leaves
# them unset so every agent's own values apply).
environment_hook() {
  local first="$1" gpus="$2" vendor="$3" cpuset="$4" cpus="$5" memory="$6" renders="$7"
  local count visible
  count="$(tr ',' '\n' <<<"$gpus" | wc -l)"
  visible="$(container_devices "$count")"
  cat <<HOOK
#!/usr/bin/env bash
# Generated by setup-node.sh for GPU(s) ${gpus}. Binds every job on this agent to them.
set -euo pipefail
export KERNELBOT_GPU_INDEX=${first}
export KERNELBOT_GPUS=${gpus}
export KERNELBOT_GPU_COUNT=${count}
export KERNELBOT_GPU_VENDOR=${vendor}
export KERNELBOT_CPUSET=${cpuset}
export KERNELBOT_CPUS=${cpus}
export KERNELBOT_MEMORY=${memory}
export KERNELBOT_PIDS_LIMIT=${PIDS_LIMIT}
export KERNELBOT_PAUSE_MINUTES=${PAUSE_MINUTES}
export BUILDKITE_PLUGIN_DOCKER_CPUS=${cpus}
export BUILDKITE_PLUGIN_DOCKER_MEMORY=${memory}
export BUILDKITE_PLUGIN_DOCKER_MEMORY_SWAP=${memory}
# No stdin in the container (\`docker run\` without -i): the plugin reads this, though its
# option schema, which the pipeline must pass, has no such option.
export BUILDKITE_PLUGIN_DOCKER_INTERACTIVE=false
# A fresh clone for every job: nothing a job left in the checkout reaches the next one.
export BUILDKITE_CLEAN_CHECKOUT=true
export PATH="${WRAPPER_DIR}:\${PATH}"
# The docker plugin would mount these into the container: the agent's job API and binary.
unset BUILDKITE_AGENT_JOB_API_SOCKET BUILDKITE_AGENT_JOB_API_TOKEN BUILDKITE_AGENT_BINARY_PATH
HOOK
  if [[ "$vendor" == nvidia ]]; then
    local docker_gpus="device=${gpus}"
    # Docker reads --gpus as CSV: several devices must be quoted inside the value.
    ((count == 1)) || docker_gpus="'\"device=${gpus}\"'"
    cat <<HOOK
export NVIDIA_VISIBLE_DEVICES=${gpus}
export CUDA_VISIBLE_DEVICES=${visible}
export BUILDKITE_PLUGIN_DOCKER_GPUS=${docker_gpus}
HOOK
  else
    local i=1 node
    cat <<HOOK
# Only this agent's render nodes enter the container, where they are devices ${visible}.
export ROCR_VISIBLE_DEVICES=${visible}
export HIP_VISIBLE_DEVICES=${visible}
export BUILDKITE_PLUGIN_DOCKER_DEVICES_0=/dev/kfd
HOOK
    for node in $renders; do
      echo "export BUILDKITE_PLUGIN_DOCKER_DEVICES_${i}=/dev/dri/${node}"
      i=$((i + 1))
    done
    echo "export KERNELBOT_RENDER_NODES=\"${renders}\""
  fi
}

# The name of agent $1's units: after its GPU (gpu3), or its GPUs' range (gpus0-7).
agent_unit() {
  local first=$(($1 * GPUS_PER_AGENT))
  if ((GPUS_PER_AGENT == 1)); then
    echo "gpu${first}"
  else
    echo "gpus${first}-$((first + GPUS_PER_AGENT - 1))"
  fi
}

# Agent $1, holding GPUS_PER_AGENT GPUs from $1 * GPUS_PER_AGENT on, with $3 CPUs and $4
# GiB; $5 its render nodes (AMD).
setup_agent() {
  local agent="$1" vendor="$2" cpus="$3" memory_gb="$4" renders="${5:-}"
  local first last gpus unit tag cpu_start cpuset config_dir build_dir name hook i
  first=$((agent * GPUS_PER_AGENT))
  last=$((first + GPUS_PER_AGENT - 1))
  gpus="$first"
  for ((i = first + 1; i <= last; i++)); do gpus+=",$i"; done
  unit="$(agent_unit "$agent")"
  if ((GPUS_PER_AGENT == 1)); then
    tag="gpu=${first}" build_dir="/var/lib/buildkite-agent/gpu-${first}"
  else
    tag="gpus=${first}-${last}" build_dir="/var/lib/buildkite-agent/gpus-${first}-${last}"
  fi
  cpu_start=$((agent * cpus))
  cpuset="${cpu_start}-$((cpu_start + cpus - 1))"
  config_dir="/etc/buildkite-agent/agent-${first}"
  name="${NODE_NAME}-${unit}"

  ensure_dir "${build_dir}/builds"
  ensure_dir "${build_dir}/plugins"

  write_file "${config_dir}/buildkite-agent.cfg" 600 <<CFG
# Generated by setup-node.sh: agent for GPU(s) ${gpus}.
token="${BUILDKITE_AGENT_TOKEN}"
name="${name}"
tags="queue=${QUEUE},${tag},vendor=${vendor},node=${NODE_NAME}"
spawn=1
build-path="${build_dir}/builds"
plugins-path="${build_dir}/plugins"
hooks-path="${config_dir}/hooks"
# Hooks come from this node only, never from a checkout.
no-local-hooks=true
CFG

  # Not a pipe: write_file must run in this shell to count the change.
  hook="$(environment_hook "$first" "$gpus" "$vendor" "$cpuset" "$cpus" "${memory_gb}g" "$renders")"
  write_file "${config_dir}/hooks/environment" 755 <<<"$hook"

  # The output directory the container mounts, made fresh by the agent's user: the root-owned
  # result.json the runner writes into it stays removable by the next clean checkout.
  write_file "${config_dir}/hooks/pre-command" 755 <<'HOOK'
#!/usr/bin/env bash
# Generated by setup-node.sh: a fresh output directory for the evaluation step.
set -euo pipefail
rm -rf kernelbot-out
mkdir -m 755 kernelbot-out
HOOK

  # After an infrastructure failure (the runner's exit code 75: the GPU failed its pre-flight
  # or stayed throttled), the reason goes into the build's meta-data for the service's report,
  # and, for a fault that outlasts the job (the runner's infra.txt says `pause`: ECC errors,
  # a foreign process, a missing GPU...), the agent takes itself out of the queue with its own
  # token, so the pipeline's automatic retry runs elsewhere. A hot or throttled GPU is only
  # retried elsewhere: a submission must not be able to pause agents. Neither call may
  # change the job's exit status.
  write_file "${config_dir}/hooks/post-command" 755 <<'HOOK'
#!/usr/bin/env bash
# Generated by setup-node.sh: after an infrastructure failure, note why; pause this agent
# when the fault outlasts the job.
set -uo pipefail
[[ "${BUILDKITE_COMMAND_EXIT_STATUS:-}" == 75 ]] || exit 0
action="retry"
reason=""
if [[ -f kernelbot-out/infra.txt && ! -L kernelbot-out/infra.txt ]]; then
  action="$(head -n 1 kernelbot-out/infra.txt | tr -cd 'a-z')"
  reason="$(sed -n 2p kernelbot-out/infra.txt | head -c 300 | tr -cd '[:print:]')"
fi
reason="${reason:-infrastructure failure (no reason written)}"
minutes="${KERNELBOT_PAUSE_MINUTES:-240}"
buildkite-agent meta-data set "kernelbot-infra:${BUILDKITE_JOB_ID}" "${reason}" ||
  echo "kernelbot: could not record the infrastructure failure in the build's meta-data" >&2
if [[ "$action" != retry ]]; then
  if buildkite-agent pause --note "kernelbot: ${reason}" --timeout-in-minutes "${minutes}"; then
    echo "kernelbot: infrastructure failure (${reason}); agent paused for ${minutes} min"
  else
    echo "kernelbot: could not pause this agent; it stays in the queue" >&2
  fi
else
  echo "kernelbot: infrastructure failure (${reason}); retried elsewhere, agent not paused"
fi
exit 0
HOOK

  write_file "/etc/systemd/system/kernelbot-${unit}.slice" 644 <<SLICE
# Generated by setup-node.sh: the share of this node that the agent of GPU(s) ${gpus} may use.
[Unit]
Description=kernelbot agent for GPU(s) ${gpus}

[Slice]
AllowedCPUs=${cpuset}
CPUQuota=$((cpus * 100))%
MemoryMax=${memory_gb}G
SLICE

  write_file "/etc/systemd/system/buildkite-agent-${unit}.service" 644 <<UNIT
# Generated by setup-node.sh: Buildkite agent bound to GPU(s) ${gpus}.
[Unit]
Description=Buildkite agent for GPU(s) ${gpus} (queue ${QUEUE})
After=network-online.target docker.service
Wants=network-online.target

[Service]
Type=simple
User=${AGENT_USER}
Slice=kernelbot-${unit}.slice
Environment=HOME=/var/lib/buildkite-agent
ExecStart=/usr/bin/buildkite-agent start --config ${config_dir}/buildkite-agent.cfg
RestartSec=5
Restart=on-failure
TimeoutStopSec=600
KillMode=mixed

[Install]
WantedBy=multi-user.target
UNIT
}

main() {
  [[ -n "${BUILDKITE_AGENT_TOKEN:-}" ]] || die "BUILDKITE_AGENT_TOKEN is required"
  [[ -n "${QUEUE:-}" ]] || die "QUEUE is required (the Buildkite queue these GPUs serve)"
  [[ "$QUEUE" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "QUEUE must be lowercase letters, digits, - and _"
  [[ "$GPUS_PER_AGENT" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_AGENT must be a positive number"

  local vendor gpu_count node_cpus memory_gb cpus_per_gpu memory_per_gpu agents agent
  vendor="$(detect_vendor)"
  [[ "$vendor" == nvidia || "$vendor" == amd ]] || die "GPU_VENDOR must be nvidia or amd"
  gpu_count="$(detect_gpu_count "$vendor")"
  [[ "$gpu_count" =~ ^[0-9]+$ && "$gpu_count" -gt 0 ]] || die "no GPUs to set up (GPU_COUNT=$gpu_count)"
  ((gpu_count % GPUS_PER_AGENT == 0)) ||
    die "$gpu_count GPUs cannot be split into agents of GPUS_PER_AGENT=$GPUS_PER_AGENT"
  agents=$((gpu_count / GPUS_PER_AGENT))
  node_cpus="${NODE_CPUS:-$(nproc)}"
  memory_gb="$(detect_memory_gb)"
  cpus_per_gpu=$((node_cpus / gpu_count))
  memory_per_gpu=$(((memory_gb - RESERVED_MEMORY_GB) / gpu_count))
  ((cpus_per_gpu >= 1)) || die "$node_cpus CPUs cannot be shared by $gpu_count GPUs"
  ((memory_per_gpu >= 1)) || die "${memory_gb} GiB (less ${RESERVED_MEMORY_GB} reserved) cannot be shared by $gpu_count GPUs"
  local cpus=$((cpus_per_gpu * GPUS_PER_AGENT)) memory=$((memory_per_gpu * GPUS_PER_AGENT))
  if ((GPUS_PER_AGENT == 1)); then
    log "$gpu_count $vendor GPU(s) on queue $QUEUE: $cpus CPUs and ${memory} GiB each"
  else
    log "$gpu_count $vendor GPU(s) on queue $QUEUE: $agents agent(s) of $GPUS_PER_AGENT GPUs, $cpus CPUs and ${memory} GiB each"
  fi

  [[ "$PIDS_LIMIT" =~ ^[1-9][0-9]*$ ]] || die "PIDS_LIMIT must be a positive number"
  if ! [[ "$PAUSE_MINUTES" =~ ^[1-9][0-9]*$ ]] || ((PAUSE_MINUTES > 10080)); then
    die "PAUSE_MINUTES must be a number of minutes from 1 to 10080"
  fi
  local -a render_nodes=()
  if [[ "$vendor" == amd ]]; then
    read -r -a render_nodes <<<"$(detect_render_nodes)"
    ((${#render_nodes[@]} >= gpu_count)) ||
      die "found ${#render_nodes[@]} render node(s) for $gpu_count GPUs; set RENDER_NODES"
    for node in "${render_nodes[@]}"; do
      [[ "$node" =~ ^renderD[0-9]+$ ]] || die "RENDER_NODES: $node is not a render node name"
    done
  fi

  if [[ "$INSTALL" == 1 ]]; then
    install_packages "$vendor"
  fi
  local wrapper
  wrapper="$(docker_wrapper)"
  write_file "${WRAPPER_DIR}/docker" 755 <<<"$wrapper"
  for ((agent = 0; agent < agents; agent++)); do
    local renders="${render_nodes[*]:agent*GPUS_PER_AGENT:GPUS_PER_AGENT}"
    setup_agent "$agent" "$vendor" "$cpus" "$memory" "$renders"
  done
  if [[ "$START" == 1 ]]; then
    chown -R "$AGENT_USER:$AGENT_USER" /var/lib/buildkite-agent /etc/buildkite-agent
    systemctl daemon-reload
    # The packaged single agent would compete for the same GPUs.
    systemctl disable --now buildkite-agent.service 2>/dev/null || true
    for ((agent = 0; agent < agents; agent++)); do
      local service
      service="buildkite-agent-$(agent_unit "$agent").service"
      systemctl enable "$service"
      if ((CHANGED > 0)); then
        systemctl restart "$service"
      else
        systemctl start "$service"
      fi
    done
  fi
  log "done: $CHANGED change(s)"
}

main "$@"
