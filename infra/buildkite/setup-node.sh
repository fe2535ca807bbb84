#!/usr/bin/env bash
# Sets up a donated GPU node for kernelbot: one Buildkite agent per GPU (or per
# GPUS_PER_AGENT GPUs, for multi-GPU tasks), each a systemd service in its own cgroup slice
# (its GPUs' share of the node's CPUs and memory), tagged with the node's queue, and an
# environment hook that binds every job to the agent's GPUs, CPU set and memory.
# Before writing anything it reads every GPU as the runner's pre-flight does, and stops on a
# GPU the runner would refuse; it checks the agent's version and says whether profiling is
# allowed and persistence mode is on. CPUs are split by the machine's topology: each GPU
# gets whole cores of its own NUMA node, and the host keeps HOST_CORES.
# Idempotent: a second run with the same inputs changes nothing.
#
# Usage (as root):
#   BUILDKITE_AGENT_TOKEN=... QUEUE=h100 ./setup-node.sh
#
# Inputs (environment):
#   BUILDKITE_AGENT_TOKEN  agent registration token (required): the vendor's own, scoped to
#                          its queues without pipeline upload, never the upload agent's
#   QUEUE                  Buildkite queue these GPUs serve, e.g. h100, b200, mi300 (required)
#   GPU_VENDOR             nvidia | amd (default: detected with nvidia-smi, then rocm-smi)
#   GPU_COUNT              GPUs to set up (default: all detected)
#   GPUS_PER_AGENT         GPUs each agent holds (default: 1); more than 1 for a queue of
#                          multi-GPU tasks, with the CPUs and memory of as many GPUs. It
#                          must divide the GPU count; the service's GPU_QUEUES says the same
#                          (e.g. MI300x8_BK=mi300x8:8)
#   HOST_CORES             whole physical cores kept for the host, NUMA node 0's first
#                          (default: 1; at least 1)
#   NODE_MEMORY_GB         memory to divide, in GiB (default: from /proc/meminfo)
#   RESERVED_MEMORY_GB     memory kept for the host (default: 8)
#   PIDS_LIMIT             processes (and threads) one job's container may hold (default: 8192)
#   PAUSE_MINUTES          how long an agent whose GPU failed the runner's checks pauses
#                          itself (default: 240; at most 10080, Buildkite's limit)
#   REAL_DOCKER            the docker the wrapper runs (default: /usr/bin/docker)
#   RENDER_NODES           AMD: the render node of each GPU in index order, e.g.
#                          "renderD128 renderD129" (default: /dev/dri/renderD* by number)
#   NODE_NAME              agent name prefix (default: hostname)
#   ROOT                   write everything under this directory instead of / (for tests);
#                          the GPUs' NUMA nodes and the driver's parameters are read there too
#   INSTALL                1: install buildkite-agent, Docker and the vendor's container
#                          toolkit if missing (default: 1 when ROOT is /, else 0)
#   START                  1: reload systemd and (re)start the agents (default as INSTALL)
set -euo pipefail
shopt -s inherit_errexit

ROOT="${ROOT:-/}"
ROOT="${ROOT%/}"
live_default=0
[[ -z "$ROOT" ]] && live_default=1
INSTALL="${INSTALL:-$live_default}"
START="${START:-$live_default}"
RESERVED_MEMORY_GB="${RESERVED_MEMORY_GB:-8}"
GPUS_PER_AGENT="${GPUS_PER_AGENT:-1}"
HOST_CORES="${HOST_CORES:-1}"
PIDS_LIMIT="${PIDS_LIMIT:-8192}"
PAUSE_MINUTES="${PAUSE_MINUTES:-240}"
REAL_DOCKER="${REAL_DOCKER:-/usr/bin/docker}"
WRAPPER_DIR="/usr/local/lib/kernelbot/bin"
NODE_NAME="${NODE_NAME:-$(hostname -s 2>/dev/null || echo node)}"
AGENT_USER="buildkite-agent"
CHANGED=0

# The runner's pre-flight reading (MaskName::Event's fields in infra/runner/src/gpu/nvidia.rs;
# a runner test compares the two).
NVIDIA_GPU_FIELDS="index,uuid,name,temperature.gpu,power.draw,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total,retired_pages.pending,power.limit,power.default_limit"
# `buildkite-agent pause` and `resume`, which the post-command hook calls, came in this release.
MIN_AGENT_VERSION="3.96.0"

# Each GPU's NUMA node ("" when unknown), from the pre-flight.
declare -a GPU_NUMA=()
# The machine's physical cores ("socket:core"), by their first CPU; each one's CPUs and node.
declare -a CORES=()
declare -A CORE_CPUS=() CORE_NODE=()
HAS_NUMA=0
# What each agent gets: its CPU set (a compact list), how many CPUs that is, its NUMA nodes
# ("" when unknown); and the CPUs left to the host.
declare -a AGENT_CPUSET=() AGENT_CPUS=() AGENT_MEMS=()
HOST_CPUSET=""

die() {
  echo "setup-node: $*" >&2
  exit 1
}

log() {
  echo "setup-node: $*"
}

warn() {
  echo "setup-node: warning: $*" >&2
}

# The first line of $1 that is not blank.
first_line() {
  grep -m 1 '[^[:space:]]' <<<"$1" || true
}

# Runs a GPU tool's query ("$@") and prints what it printed; when it fails, stops naming
# $what (which query, of which GPU) and the tool's first line. Used as x="$(query ...)".
query() {
  local what="$1" out err status=0 said
  shift
  err="$(mktemp)"
  out="$("$@" 2>"$err")" || status=$?
  if ((status != 0)); then
    said="$(first_line "$out"$'\n'"$(cat "$err")")"
    rm -f "$err"
    die "${what} failed: $* printed: ${said:-nothing} (exit ${status}); fix the driver before adding this node"
  fi
  rm -f "$err"
  printf '%s\n' "$out"
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
  local said
  if [[ -n "${GPU_VENDOR:-}" ]]; then
    echo "$GPU_VENDOR"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo nvidia
  elif command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname --json >/dev/null 2>&1; then
    echo amd
  elif command -v nvidia-smi >/dev/null 2>&1; then
    # An NVIDIA node whose driver cannot talk to its GPUs: say what the tool said.
    said="$(first_line "$(nvidia-smi -L 2>&1)")"
    die "no GPU found: nvidia-smi -L printed: ${said:-nothing}; fix the driver before adding this node"
  else
    die "no GPU found (nvidia-smi and rocm-smi both failed); set GPU_VENDOR and GPU_COUNT"
  fi
}

detect_gpu_count() {
  local vendor="$1" list
  if [[ -n "${GPU_COUNT:-}" ]]; then
    echo "$GPU_COUNT"
  elif [[ "$vendor" == nvidia ]]; then
    list="$(query "listing the GPUs" nvidia-smi -L)"
    grep -c '^GPU ' <<<"$list" || true
  else
    list="$(query "listing the GPUs" rocm-smi --showproductname --json)"
    grep -o '"card[0-9]*"' <<<"$list" | sort -u | wc -l
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

# The NUMA node in the sysfs file $1, or nothing when unknown (no file, or -1: the firmware
# did not say).
numa_node_of() {
  local node=""
  [[ -r "$1" ]] && node="$(<"$1")"
  if [[ "$node" =~ ^[0-9]+$ ]]; then echo "$node"; fi
}

# nvidia-smi's PCI bus id (00000000:18:00.0) as sysfs names the device (0000:18:00.0);
# nothing for an id it cannot read.
sysfs_pci_address() {
  local id="${1,,}"
  if [[ "$id" =~ ^([0-9a-f]{1,8}):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$ ]]; then
    printf '%04x:%s\n' "$((16#${BASH_REMATCH[1]}))" "${BASH_REMATCH[2]}"
  fi
}

# The reading's fields as this driver names them: drivers before 535 refuse a whole query
# that names clocks_event_reasons.* (they know the mask as clocks_throttle_reasons.*).
nvidia_fields() {
  local fields out
  for fields in "$NVIDIA_GPU_FIELDS" \
    "${NVIDIA_GPU_FIELDS/clocks_event_reasons.active/clocks_throttle_reasons.active}" \
    "${NVIDIA_GPU_FIELDS/clocks_event_reasons.active,/}"; do
    if out="$(nvidia-smi -i 0 --query-gpu="$fields" --format=csv,noheader,nounits 2>&1)" ||
      [[ "$out" != *"is not a valid field to query"* ]]; then
      # Read, or failed for another reason, which the reading itself then reports.
      echo "$fields"
      return 0
    fi
  done
  echo "$NVIDIA_GPU_FIELDS"
}

# Stops on what GPU $1's reading $3 (of the fields $2) shows that makes the runner refuse
# every job: uncorrected ECC errors or pages waiting to be retired, which need a reset.
check_nvidia_reading() {
  local gpu="$1" line="$3" k ecc="" pending="" limit="" default=""
  local -a names values
  IFS=, read -r -a names <<<"$2"
  IFS=, read -r -a values <<<"${line//, /,}"
  ((${#values[@]} == ${#names[@]})) ||
    die "GPU ${gpu}'s pre-flight reading is unreadable (${#values[@]} values for ${#names[@]} fields): ${line}"
  for k in "${!names[@]}"; do
    case "${names[k]}" in
      ecc.errors.uncorrected.volatile.total) ecc="${values[k]}" ;;
      retired_pages.pending) pending="${values[k]}" ;;
      power.limit) limit="${values[k]}" ;;
      power.default_limit) default="${values[k]}" ;;
    esac
  done
  local fix="reset it (nvidia-smi -r -i ${gpu}, with nothing running on it) or reboot, then run this again"
  if [[ "$ecc" =~ ^[0-9]+$ ]] && ((ecc > 0)); then
    die "GPU ${gpu} has ${ecc} uncorrected ECC error(s): the runner would refuse every job on it; ${fix}"
  fi
  if [[ "$pending" == Yes ]]; then
    die "GPU ${gpu} has pages waiting to be retired: the runner would refuse every job on it; ${fix}"
  fi
  # A kernel held at its power limit runs at its real speed only at the board's own limit
  # (the runner refuses one set more than 5% below it).
  if [[ "$limit" =~ ^[0-9.]+$ && "$default" =~ ^[0-9.]+$ ]] &&
    awk -v l="$limit" -v d="$default" 'BEGIN { exit !(l < 0.95 * d) }'; then
    die "GPU ${gpu}'s power limit is set to ${limit} W, below its default of ${default} W: the runner would refuse every job on it; restore it (nvidia-smi -i ${gpu} -pl ${default}) and run this again"
  fi
}

# The runner's pre-flight, once per GPU: stops when a query fails or a GPU shows a fault the
# runner refuses every job for. Also reads each GPU's NUMA node (GPU_NUMA) and warns when
# persistence mode is off.
nvidia_preflight() {
  local count="$1" fields i line bus processes
  local -a off=()
  fields="$(nvidia_fields)"
  if [[ "$fields" != *clocks_event_reasons.active* ]]; then
    if [[ "$fields" == *clocks_throttle_reasons.active* ]]; then
      log "this driver (before 535) names the clock-event mask clocks_throttle_reasons.active"
    else
      warn "this driver reads neither clocks_event_reasons.active nor clocks_throttle_reasons.active: slowdowns cannot be read on this driver"
    fi
  fi
  log "reading every GPU as the runner's pre-flight does: ${fields}"
  for ((i = 0; i < count; i++)); do
    line="$(query "GPU ${i}'s pre-flight query" nvidia-smi -i "$i" --query-gpu="$fields" --format=csv,noheader,nounits)"
    line="$(first_line "$line")"
    [[ -n "$line" ]] || die "GPU ${i}'s pre-flight query printed nothing; fix the driver before adding this node"
    log "GPU ${i}: ${line}"
    check_nvidia_reading "$i" "$fields" "$line"
    line="$(query "GPU ${i}'s PCI query" nvidia-smi -i "$i" --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader)"
    line="$(first_line "$line")"
    bus="${line%%,*}"
    GPU_NUMA[i]="$(numa_node_of "$ROOT/sys/bus/pci/devices/$(sysfs_pci_address "$bus")/numa_node")"
    [[ "${line#*, }" == Enabled ]] || off+=("$i")
  done
  processes="$(query "the compute-process query" nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits)"
  if [[ -n "$(first_line "$processes")" ]]; then
    warn "compute processes on the GPUs now (pid, GPU, MiB): $(grep '[^[:space:]]' <<<"$processes" | paste -sd ';'); the runner refuses a GPU that has one"
  fi
  if ((${#off[@]} > 0)); then
    warn "persistence mode is off on GPU(s) ${off[*]}: the driver then sets each GPU up afresh for every job (slow queries, clocks reset); turn it on with 'nvidia-smi -pm 1', or better enable the nvidia-persistenced service (systemctl enable --now nvidia-persistenced)"
  fi
}

# Reads amd-smi's JSON on stdin. `reading`: the GPU's uncorrected ECC count, then its
# reading in one line; `processes`: one line per process. Fails on JSON it cannot read.
amd_json() {
  local code
  code="$(
    cat <<'PY'
import json, sys
doc = json.load(sys.stdin)
# A list of GPUs; newer releases wrap it as {"gpu_data": [...]} (as the runner reads it).
if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
    doc = doc["gpu_data"]
if not isinstance(doc, list) or not all(isinstance(g, dict) for g in doc):
    sys.exit("not a list of GPUs")
def value(entry, *path):
    for key in path:
        entry = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(entry, dict):
        entry = f"{entry.get('value')} {entry.get('unit', '')}".strip()
    return "N/A" if entry is None else entry
def count(entry, *path):
    for key in path:
        entry = entry.get(key) if isinstance(entry, dict) else None
    entry = entry.get("value") if isinstance(entry, dict) else entry
    return entry if isinstance(entry, int) else 0
if sys.argv[1] == "reading":
    if len(doc) != 1:
        sys.exit(f"{len(doc)} GPUs where one was asked for")
    gpu = doc[0]
    ecc = count(gpu, "ecc", "total_uncorrectable_count")
    print(ecc,
          f"hotspot {value(gpu, 'temperature', 'hotspot')}, power {value(gpu, 'power', 'socket_power')},",
          f"GFX clock {value(gpu, 'clock', 'gfx_0', 'clk')} (max {value(gpu, 'clock', 'gfx_0', 'max_clk')}),",
          f"{value(gpu, 'power', 'throttle_status')}, {ecc} uncorrectable ECC error(s)")
else:
    for gpu in doc:
        for item in gpu.get("process_list", []):
            info = item.get("process_info") if isinstance(item, dict) else None
            if isinstance(info, dict):
                print(f"GPU {gpu.get('gpu')}: pid {info.get('pid')} ({info.get('name')})")
PY
  )"
  python3 -c "$code" "$1"
}

# As nvidia_preflight, with amd-smi (ROCm 6 and later: what the runner reads); $2... the
# GPUs' render nodes, whose sysfs devices give their NUMA nodes.
amd_preflight() {
  local count="$1" i json ecc line processes
  local -a render_list=("${@:2}")
  command -v amd-smi >/dev/null 2>&1 ||
    die "amd-smi is not installed: the runner's pre-flight reads the GPUs with it; install ROCm 6 or later's amd-smi (Ubuntu: apt-get install amd-smi-lib) and put it on PATH (/opt/rocm/bin)"
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to read amd-smi's JSON"
  for ((i = 0; i < count; i++)); do
    json="$(query "GPU ${i}'s pre-flight query" amd-smi metric --json -g "$i")"
    line="$(amd_json reading <<<"$json" 2>/dev/null)" ||
      die "GPU ${i}'s pre-flight reading is unreadable: amd-smi metric --json -g ${i} printed: $(first_line "$json")"
    read -r ecc line <<<"$line"
    log "GPU ${i}: ${line}"
    if ((ecc > 0)); then
      die "GPU ${i} has ${ecc} uncorrected ECC error(s): the runner would refuse every job on it; reset it (amd-smi reset -G -g ${i}, with nothing running on it) or reboot, then run this again"
    fi
    GPU_NUMA[i]="$(numa_node_of "$ROOT/sys/class/drm/${render_list[i]}/device/numa_node")"
  done
  processes="$(query "the process query" amd-smi process --json)"
  processes="$(amd_json processes <<<"$processes" 2>/dev/null)" ||
    die "amd-smi process --json printed what cannot be read: $(first_line "$processes")"
  if [[ -n "$processes" ]]; then
    warn "processes on the GPUs now: $(paste -sd ';' <<<"$processes"); the runner refuses a GPU that has one"
  fi
}

# The post-command hook pauses the agent with `buildkite-agent pause`, which older agents
# lack. Not installed: an error when the agents are to start now, else a warning.
check_agent() {
  local said version
  if ! command -v buildkite-agent >/dev/null 2>&1; then
    [[ "$START" != 1 ]] ||
      die "buildkite-agent is not installed: install it (INSTALL=1 does), version ${MIN_AGENT_VERSION} or later"
    warn "buildkite-agent is not installed: the agents need version ${MIN_AGENT_VERSION} or later"
    return 0
  fi
  said="$(buildkite-agent --version 2>&1 || true)"
  [[ "$said" =~ version\ v?([0-9]+\.[0-9]+\.[0-9]+) ]] ||
    die "cannot read buildkite-agent's version: buildkite-agent --version printed: $(first_line "$said")"
  version="${BASH_REMATCH[1]}"
  if [[ "$(printf '%s\n' "$MIN_AGENT_VERSION" "$version" | sort -V | head -n 1)" != "$MIN_AGENT_VERSION" ]]; then
    die "buildkite-agent ${version} is too old: the agents pause themselves with 'buildkite-agent pause', which came in ${MIN_AGENT_VERSION}; upgrade it (apt-get update && apt-get install --only-upgrade buildkite-agent) and run this again"
  fi
  log "buildkite-agent ${version}"
}

# Profile mode's Nsight Compute reads the GPU's performance counters as the sandbox's
# unprivileged user, which the driver allows only when loaded with
# NVreg_RestrictProfilingToAdminUsers=0. A warning: the other modes work without it.
check_profiling() {
  local params="$ROOT/proc/driver/nvidia/params" value=""
  [[ -r "$params" ]] && value="$(sed -n 's/^RmProfilingAdminOnly: *//p' "$params" | head -n 1)"
  case "$value" in
    0) log "profiling is allowed: the driver lets every user read the GPUs' performance counters (RmProfilingAdminOnly: 0)" ;;
    1) warn "profiling is restricted to administrators (RmProfilingAdminOnly: 1): profile mode's Nsight Compute will fail with ERR_NVGPUCTRPERM. To allow it: echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' > /etc/modprobe.d/kernelbot-profiling.conf && update-initramfs -u, then reboot" ;;
    *) log "could not tell whether profiling is allowed (no RmProfilingAdminOnly in /proc/driver/nvidia/params)" ;;
  esac
}

# The machine's physical cores (CORES, CORE_CPUS, CORE_NODE) from lscpu: hyperthreads of one
# core share its CORE id; NODE is empty when the kernel has no NUMA information (node 0).
read_topology() {
  local out cpu core socket node key
  out="$(lscpu -p=CPU,CORE,SOCKET,NODE 2>&1)" || die "lscpu failed: $(first_line "$out")"
  while IFS=, read -r cpu core socket node; do
    [[ -z "$cpu" || "$cpu" == \#* ]] && continue
    [[ "$cpu" =~ ^[0-9]+$ && "$core" =~ ^[0-9]*$ && "$socket" =~ ^[0-9]*$ && "$node" =~ ^[0-9]*$ ]] ||
      die "lscpu printed a line that cannot be read: ${cpu},${core},${socket},${node}"
    [[ -n "$node" ]] && HAS_NUMA=1
    key="${socket:-0}:${core:-$cpu}"
    if [[ -z "${CORE_NODE[$key]:-}" ]]; then
      CORES+=("$key")
      CORE_NODE[$key]="${node:-0}"
    fi
    CORE_CPUS[$key]+="${CORE_CPUS[$key]:+ }${cpu}"
  done <<<"$out"
  ((${#CORES[@]} > 0)) || die "lscpu listed no CPUs"
}

# Numbers (ascending) as a cpuset list: "0 1 2 5 7 8" is "0-2,5,7-8".
compact() {
  local out="" start="" prev="" n
  for n in "$@" ""; do
    if [[ -n "$n" && -n "$prev" ]] && ((n == prev + 1)); then
      prev="$n"
      continue
    fi
    if [[ -n "$start" ]]; then
      out+="${out:+,}${start}"
      ((prev == start)) || out+="-${prev}"
    fi
    start="$n" prev="$n"
  done
  echo "$out"
}

# The CPUs of the cores "$@", in order.
cpus_of() {
  local key
  local -a list=()
  for key in "$@"; do
    read -r -a list <<<"${CORE_CPUS[$key]}"
    printf '%s\n' "${list[@]}"
  done | sort -n | tr '\n' ' '
}

# Splits the cores among the agents: HOST_CORES whole cores for the host (NUMA node 0's
# first), then the same number of whole cores for every GPU, from its own node, so a job's
# threads, memory and GPU stay on one node; an agent of several GPUs gets theirs together.
# A GPU whose node is unknown is on node 0 of a one-node machine; on a machine of several
# nodes the whole machine is then one pool. Fills AGENT_CPUSET, AGENT_CPUS, AGENT_MEMS and
# HOST_CPUSET.
split_cpus() {
  local gpu_count="$1" node key i n start agent per_gpu=-1 pooled=0 short=""
  local -A node_cores=() gpus_on=() taken=() agent_cores=() agent_nodes=()
  local -a nodes cores
  for key in "${CORES[@]}"; do node_cores[${CORE_NODE[$key]}]+="${key} "; done
  read -r -a nodes <<<"$(printf '%s\n' "${!node_cores[@]}" | sort -n | tr '\n' ' ')"
  for ((i = 0; i < gpu_count; i++)); do
    node="${GPU_NUMA[i]:-}"
    if [[ -n "$node" && -n "${node_cores[$node]:-}" ]]; then continue; fi
    if ((${#nodes[@]} == 1)); then
      GPU_NUMA[i]="${nodes[0]}"
    else
      pooled=1
    fi
  done
  if ((pooled)); then
    warn "the NUMA node of some GPU is unknown (no numa_node in sysfs, or -1) on a machine of ${#nodes[@]} nodes: its cores are split as one pool, whatever their node"
    node_cores=([pool]="${CORES[*]}")
    nodes=(pool)
    for ((i = 0; i < gpu_count; i++)); do GPU_NUMA[i]=pool; done
  fi
  # The host's cores first, from the lowest node on.
  n="$HOST_CORES"
  for node in "${nodes[@]}"; do
    read -r -a cores <<<"${node_cores[$node]}"
    taken[$node]=0
    while ((n > 0 && ${taken[$node]} < ${#cores[@]})); do
      taken[$node]=$((${taken[$node]} + 1)) n=$((n - 1))
    done
  done
  ((n == 0)) || die "HOST_CORES=${HOST_CORES} is more than the machine's ${#CORES[@]} cores"
  # Every GPU the same number of whole cores: as many as the most crowded node allows.
  for ((i = 0; i < gpu_count; i++)); do
    node="${GPU_NUMA[i]}"
    gpus_on[$node]=$((${gpus_on[$node]:-0} + 1))
  done
  for node in "${!gpus_on[@]}"; do
    read -r -a cores <<<"${node_cores[$node]}"
    n=$(((${#cores[@]} - ${taken[$node]}) / ${gpus_on[$node]}))
    if ((per_gpu < 0 || n < per_gpu)); then per_gpu="$n" short="$node"; fi
  done
  if ((per_gpu == 0)); then
    read -r -a cores <<<"${node_cores[$short]}"
    n=$((${#cores[@]} - ${taken[$short]}))
    node="NUMA node ${short}"
    [[ "$short" != pool ]] || node="the machine"
    die "not a whole core for every GPU: ${node} has ${n} core(s) left after the host's ${HOST_CORES} (HOST_CORES) for its ${gpus_on[$short]} GPU(s); set up fewer GPUs (GPU_COUNT) or keep fewer host cores"
  fi
  for ((i = 0; i < gpu_count; i++)); do
    node="${GPU_NUMA[i]}" agent=$((i / GPUS_PER_AGENT))
    read -r -a cores <<<"${node_cores[$node]}"
    start="${taken[$node]}"
    agent_cores[$agent]+="${cores[*]:start:per_gpu} "
    taken[$node]=$((start + per_gpu))
    [[ "$node" == pool ]] || agent_nodes[$agent]+="${node} "
  done
  fill_agent_sets "$((gpu_count / GPUS_PER_AGENT))"
}

# For split_cpus (whose agent_cores and agent_nodes it reads, bash's locals being seen by
# the functions a function calls): each of the $1 agents' CPU set, CPU count and memory
# nodes, and the CPUs left to the host.
fill_agent_sets() {
  local agents="$1" agent
  local -a cores cpu_list mem_list all assigned=()
  for ((agent = 0; agent < agents; agent++)); do
    read -r -a cores <<<"${agent_cores[$agent]}"
    read -r -a cpu_list <<<"$(cpus_of "${cores[@]}")"
    assigned+=("${cpu_list[@]}")
    AGENT_CPUSET[agent]="$(compact "${cpu_list[@]}")"
    AGENT_CPUS[agent]="${#cpu_list[@]}"
    AGENT_MEMS[agent]=""
    # The memory nodes, when lscpu knew them and the GPUs' nodes are known.
    read -r -a mem_list <<<"$(tr ' ' '\n' <<<"${agent_nodes[$agent]:-}" | sort -nu | tr '\n' ' ')"
    if ((HAS_NUMA && ${#mem_list[@]} > 0)); then AGENT_MEMS[agent]="$(compact "${mem_list[@]}")"; fi
  done
  read -r -a all <<<"$(cpus_of "${CORES[@]}")"
  read -r -a cpu_list <<<"$(printf '%s\n' "${all[@]}" "${assigned[@]}" | sort -n | uniq -u | tr '\n' ' ')"
  HOST_CPUSET="$(compact "${cpu_list[@]}")"
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
mems=()
[[ -z "${KERNELBOT_MEMS:-}" ]] || mems=(--cpuset-mems="$KERNELBOT_MEMS")
exec "$real" "$sub" --cpuset-cpus="$KERNELBOT_CPUSET" "${mems[@]}" --pids-limit="$KERNELBOT_PIDS_LIMIT" "$@"
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
  local first="$1" gpus="$2" vendor="$3" cpuset="$4" cpus="$5" memory="$6" renders="$7" mems="${8:-}"
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
  if [[ -n "$mems" ]]; then
    # The job's memory on its GPU's NUMA node(s): the container runs in docker's cgroup, not
    # the agent's slice, so the wrapper passes it (--cpuset-mems).
    echo "export KERNELBOT_MEMS=${mems}"
  fi
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

# Agent $1, holding GPUS_PER_AGENT GPUs from $1 * GPUS_PER_AGENT on, with the CPU set $3 of
# $4 CPUs, the memory nodes $5 ("" when unknown) and $6 GiB; $7 its render nodes (AMD).
setup_agent() {
  local agent="$1" vendor="$2" cpuset="$3" cpus="$4" mems="$5" memory_gb="$6" renders="${7:-}"
  local first last gpus unit tag config_dir build_dir name hook i mems_line=""
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
  hook="$(environment_hook "$first" "$gpus" "$vendor" "$cpuset" "$cpus" "${memory_gb}g" "$renders" "$mems")"
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
  # before the submission ran), the reason goes into the build's meta-data for the service's
  # report, and, for a fault that outlasts the job (the runner's infra.txt says `pause`: ECC errors,
  # a foreign process, a missing GPU...), the agent takes itself out of the queue with its own
  # token, so the pipeline's automatic retry runs elsewhere. A hot or throttled GPU is only
  # retried elsewhere: a submission must not be able to pause agents. Exit 76 (a timed run
  # stayed throttled after the submission ran: perhaps its own heat) is noted the same way
  # and never pauses, whatever infra.txt says. Neither call may change the job's exit status.
  #
  # First, whatever the exit status: the runner's result.meta (result.json packed, written
  # only when it fits Buildkite's 100,000-byte value) becomes build meta-data
  # `kernelbot-result`, so build.finished carries the result under Buildkite's signature and
  # the service needs no API call to read it. Without it the service reads the artifact.
  write_file "${config_dir}/hooks/post-command" 755 <<'HOOK'
#!/usr/bin/env bash
# Generated by setup-node.sh: the result into the build's meta-data; after an
# infrastructure failure, note why; pause this agent when the fault outlasts the job
# (never after 76: the submission may have caused it).
set -uo pipefail
meta=kernelbot-out/result.meta
# A slow Agent API must not hold up the job's end, nor the note and pause below.
if [[ -f "$meta" && ! -L "$meta" ]] && (($(wc -c <"$meta") <= 100000)); then
  timeout 60 buildkite-agent meta-data set kernelbot-result <"$meta" ||
    echo "kernelbot: could not put the result in the build's meta-data (the artifact is read instead)" >&2
fi
exit_status="${BUILDKITE_COMMAND_EXIT_STATUS:-}"
[[ "$exit_status" == 75 || "$exit_status" == 76 ]] || exit 0
action="retry"
reason=""
if [[ -f kernelbot-out/infra.txt && ! -L kernelbot-out/infra.txt ]]; then
  action="$(head -n 1 kernelbot-out/infra.txt | tr -cd 'a-z')"
  reason="$(sed -n 2p kernelbot-out/infra.txt | head -c 300 | tr -cd '[:print:]')"
fi
# 76: the GPU stayed throttled after the submission's own run, whose heat may be the cause.
[[ "$exit_status" == 75 ]] || action="retry"
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
elif [[ "$exit_status" == 76 ]]; then
  echo "kernelbot: a timed run stayed throttled (${reason}), perhaps from the submission's own heat; retried once, agent not paused"
else
  echo "kernelbot: infrastructure failure (${reason}); retried elsewhere, agent not paused"
fi
exit 0
HOOK

  [[ -z "$mems" ]] || mems_line=$'\n'"AllowedMemoryNodes=${mems}"
  write_file "/etc/systemd/system/kernelbot-${unit}.slice" 644 <<SLICE
# Generated by setup-node.sh: the share of this node that the agent of GPU(s) ${gpus} may use.
[Unit]
Description=kernelbot agent for GPU(s) ${gpus}

[Slice]
AllowedCPUs=${cpuset}${mems_line}
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

# The inputs that need no GPU to check, checked before any GPU is read.
check_inputs() {
  [[ -n "${BUILDKITE_AGENT_TOKEN:-}" ]] || die "BUILDKITE_AGENT_TOKEN is required"
  [[ -n "${QUEUE:-}" ]] || die "QUEUE is required (the Buildkite queue these GPUs serve)"
  [[ "$QUEUE" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "QUEUE must be lowercase letters, digits, - and _"
  [[ "$GPUS_PER_AGENT" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_AGENT must be a positive number"
  [[ "$HOST_CORES" =~ ^[1-9][0-9]*$ ]] || die "HOST_CORES must be a number of cores, 1 or more"
  [[ "$PIDS_LIMIT" =~ ^[1-9][0-9]*$ ]] || die "PIDS_LIMIT must be a positive number"
  if ! [[ "$PAUSE_MINUTES" =~ ^[1-9][0-9]*$ ]] || ((PAUSE_MINUTES > 10080)); then
    die "PAUSE_MINUTES must be a number of minutes from 1 to 10080"
  fi
  [[ -z "${NODE_CPUS:-}" ]] ||
    warn "NODE_CPUS is no longer read: CPUs are split by the machine's topology (lscpu), HOST_CORES cores kept for the host"
}

# Reloads systemd and (re)starts the $1 agents: restarted when anything changed.
start_agents() {
  local agents="$1" agent service
  chown -R "$AGENT_USER:$AGENT_USER" /var/lib/buildkite-agent /etc/buildkite-agent
  systemctl daemon-reload
  # The packaged single agent would compete for the same GPUs.
  systemctl disable --now buildkite-agent.service 2>/dev/null || true
  for ((agent = 0; agent < agents; agent++)); do
    service="buildkite-agent-$(agent_unit "$agent").service"
    systemctl enable "$service"
    if ((CHANGED > 0)); then
      systemctl restart "$service"
    else
      systemctl start "$service"
    fi
  done
}

main() {
  check_inputs
  local vendor gpu_count memory_gb memory_per_gpu agents agent node
  vendor="$(detect_vendor)"
  [[ "$vendor" == nvidia || "$vendor" == amd ]] || die "GPU_VENDOR must be nvidia or amd"
  gpu_count="$(detect_gpu_count "$vendor")"
  [[ "$gpu_count" =~ ^[0-9]+$ && "$gpu_count" -gt 0 ]] || die "no GPUs to set up (GPU_COUNT=$gpu_count)"
  ((gpu_count % GPUS_PER_AGENT == 0)) ||
    die "$gpu_count GPUs cannot be split into agents of GPUS_PER_AGENT=$GPUS_PER_AGENT"
  agents=$((gpu_count / GPUS_PER_AGENT))
  memory_gb="$(detect_memory_gb)"
  memory_per_gpu=$(((memory_gb - RESERVED_MEMORY_GB) / gpu_count))
  ((memory_per_gpu >= 1)) || die "${memory_gb} GiB (less ${RESERVED_MEMORY_GB} reserved) cannot be shared by $gpu_count GPUs"
  local -a render_nodes=()
  if [[ "$vendor" == amd ]]; then
    read -r -a render_nodes <<<"$(detect_render_nodes)"
    ((${#render_nodes[@]} >= gpu_count)) ||
      die "found ${#render_nodes[@]} render node(s) for $gpu_count GPUs; set RENDER_NODES"
    for node in "${render_nodes[@]}"; do
      [[ "$node" =~ ^renderD[0-9]+$ ]] || die "RENDER_NODES: $node is not a render node name"
    done
  fi

  # Nothing is written for a node whose GPUs the runner would refuse.
  if [[ "$vendor" == nvidia ]]; then
    nvidia_preflight "$gpu_count"
    check_profiling
  else
    amd_preflight "$gpu_count" "${render_nodes[@]}"
  fi
  read_topology
  split_cpus "$gpu_count"
  local memory=$((memory_per_gpu * GPUS_PER_AGENT))
  if ((GPUS_PER_AGENT == 1)); then
    log "$gpu_count $vendor GPU(s) on queue $QUEUE: ${AGENT_CPUS[0]} CPUs and ${memory} GiB each"
  else
    log "$gpu_count $vendor GPU(s) on queue $QUEUE: $agents agent(s) of $GPUS_PER_AGENT GPUs, ${AGENT_CPUS[0]} CPUs and ${memory} GiB each"
  fi
  for ((agent = 0; agent < agents; agent++)); do
    log "$(agent_unit "$agent"): CPUs ${AGENT_CPUSET[agent]} (${AGENT_CPUS[agent]}), memory node(s) ${AGENT_MEMS[agent]:-unknown}, ${memory} GiB"
  done
  log "the host keeps CPUs ${HOST_CPUSET} (HOST_CORES=${HOST_CORES}, and the cores left over)"

  if [[ "$INSTALL" == 1 ]]; then
    install_packages "$vendor"
  fi
  check_agent
  local wrapper
  wrapper="$(docker_wrapper)"
  write_file "${WRAPPER_DIR}/docker" 755 <<<"$wrapper"
  for ((agent = 0; agent < agents; agent++)); do
    local renders="${render_nodes[*]:agent*GPUS_PER_AGENT:GPUS_PER_AGENT}"
    setup_agent "$agent" "$vendor" "${AGENT_CPUSET[agent]}" "${AGENT_CPUS[agent]}" "${AGENT_MEMS[agent]}" "$memory" "$renders"
  done
  if [[ "$START" == 1 ]]; then
    start_agents "$agents"
  fi
  log "done: $CHANGED change(s)"
}

main "$@"
