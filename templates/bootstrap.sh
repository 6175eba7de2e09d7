#!/usr/bin/env bash
# cloudtrain node bootstrap: prepares one node (driver, CUDA-matched PyTorch, NCCL settings, the
# cloudtrain node agent) in phases, and reports each phase to a status file the coordinator reads.
# A static script, not a template: everything node-specific comes from the config file.
#
# Usage:  bootstrap.sh [CONFIG]        CONFIG defaults to /etc/cloudtrain/bootstrap.env
#
# Run it as the user that owns CT_ROOT (the node's `cloudtrain` user); it uses `sudo -n` for
# apt-get, modprobe and systemctl only (nothing when it already runs as root).
#
# CONFIG holds KEY=VALUE lines, values quoted by Python's shlex.quote. cloudtrain alone writes it,
# so the script sources it (`. CONFIG`); never point it at a file anyone else can write. CT_*
# variables in the environment are ignored: the file is the whole configuration. Keys [default]:
#   CT_ROOT                the node's cloudtrain folder: /home/cloudtrain/.cloudtrain (required)
#   CT_STATUS              the status JSON          [$CT_ROOT/bootstrap/status.json]
#   CT_LOG_DIR             <phase>.log files        [$CT_ROOT/bootstrap/logs]
#   CT_PHASES              phases to run, in order  [base nvidia-driver python torch nccl
#                                                    cloudtrain verify]
#   CT_INSTALL             1: install what is missing; 0: check only (the local provider)  [1]
#   CT_PYTHON              the interpreter when CT_INSTALL=0; makes the venv when 1  [python3]
#   CT_VENV                the venv made when CT_INSTALL=1  [$CT_ROOT/venv]
#   CT_ACCELERATOR         V100, V100-32GB, A100, A100-80GB; empty for CPU
#   CT_GPU_COUNT           GPUs on this node; 0 for CPU  [0]
#   CT_DRIVER_BRANCH       NVIDIA driver branch: apt package nvidia-driver-<branch>-server
#   CT_MIN_DRIVER          lowest driver version the torch build needs; an older one is replaced
#   CT_TORCH_INDEX         pip --index-url for torch, e.g. https://download.pytorch.org/whl/cu126
#   CT_TORCH_VERSION       pip requirement for torch, e.g. torch==2.13.0
#   CT_EFA                 1 on instances with an Elastic Fabric Adapter (p3dn, p4d, p4de)  [0]
#   CT_NCCL_SOCKET_IFNAME  network interface for NCCL and gloo traffic (optional)
#   CT_NCCL_ENV            the fabric's NCCL settings, KEY=value words (InfiniBand sizes)
#   CT_CLOUDTRAIN_WHEEL    path of a cloudtrain wheel on this node
#   CT_CLOUDTRAIN_VERSION  the cloudtrain version the node agent must have (optional)
#   CT_LOCK_TIMEOUT        seconds a second run waits for the first one  [600]
# The node agent comes from a wheel, not a package index: the coordinator copies the wheel of its
# own version over SSH and re-runs this script, so node and coordinator always run the same
# cloudtrain, released or not, and the node needs no index that hosts it.
#
# Phases (each idempotent, timed, logged to $CT_LOG_DIR/<phase>.log). "check-only:" is what the
# phase does with CT_INSTALL=0.
#   base           apt-get install python3-venv python3-pip rsync, those missing.
#                  check-only: skipped
#   nvidia-driver  skipped on CPU, and when nvidia-smi reports a driver >= CT_MIN_DRIVER; else
#                  apt-get install nvidia-driver-<branch>-server (+ nvidia-fabricmanager-<branch>
#                  when lspci shows an NVSwitch), then nvidia-smi must work.
#                  check-only: fails unless such a driver is there
#   python         make the venv with CT_PYTHON (kept when it exists); it must be Python >= 3.11 (cloudtrain's own floor).
#                  check-only: CT_PYTHON runs and is Python >= 3.11 (cloudtrain's own floor)
#   torch          pip install CT_TORCH_VERSION from CT_TORCH_INDEX unless the installed torch
#                  matches the pin and the index's CUDA.
#                  check-only: torch imports; prints its version and CUDA (a mismatch: a warning)
#   nccl           write $CT_ROOT/nccl.env (KEY='value' lines): NCCL_ and GLOO_SOCKET_IFNAME when
#                  given; on EFA FI_PROVIDER=efa, NCCL_PROTO=simple and, except on Volta,
#                  FI_EFA_USE_DEVICE_RDMA=1; the CT_NCCL_ENV settings. Every job on the node
#                  gets them. CPU node: a comment-only file, phase skipped.
#                  check-only: the same
#   cloudtrain     pip install CT_CLOUDTRAIN_WHEEL unless cloudtrain CT_CLOUDTRAIN_VERSION is
#                  installed; no wheel yet: exit 75, waiting for the coordinator to copy it.
#                  check-only: CT_PYTHON imports cloudtrain, of CT_CLOUDTRAIN_VERSION when set
#   verify         torch imports; GPU node: CUDA is available, CT_GPU_COUNT GPUs that the build
#                  has kernels for, and an NCCL all_reduce across them (torch.distributed.run
#                  --standalone); CPU node: a gloo all_reduce, world size 1.
#                  check-only: the same, with CT_PYTHON
#
# Status protocol. $CT_STATUS is rewritten atomically (temp file + mv) at every change:
#   {"phase": "<phase running, failed, or last>", "state": "running"|"ready"|"failed",
#    "phases": [{"name": "<phase>", "state": "pending"|"running"|"done"|"skipped"|"failed",
#                "started": "<UTC ISO 8601>"|null, "finished": "<UTC ISO 8601>"|null,
#                "exit_code": <int>|null, "log": "<path of the phase's log>"}, ...]}
# It is generated in pure shell with JSON string escaping (no interpreter is needed before the
# python phase). The truth behind it is one record per phase in $CT_ROOT/bootstrap/phases/; a
# phase counts as finished when its record is done/skipped AND the config keys it depends on are
# unchanged. A run starts at the first phase that has not finished and runs every phase after it:
# after success a re-run does nothing (exit 0, still ready); after a failure it resumes at the
# failed phase; after a config change (a new CT_CLOUDTRAIN_VERSION, say) it redoes the phases that
# depend on the change and those after them. Runs are serialised by flock on
# $CT_ROOT/bootstrap/lock (a mkdir lock where flock is missing); the second run waits.
#
# Exit codes: 0 ready; otherwise the failed phase's exit code, in particular
#   75  cloudtrain phase: the wheel is not on the node yet (copy it, then run again)
#   76  nvidia-driver phase: driver installed but not loaded; reboot the node, then run again
#   124 verify timed out
#   129, 130, 143  the run got SIGHUP, SIGINT, SIGTERM (the running phase is recorded as failed)
# and, before any phase runs (the status file is left as it was):
#   64 usage, 69 another run held the lock for CT_LOCK_TIMEOUT seconds, 78 bad config.

set -u -o pipefail # no `set -e` here: each phase runs in a subshell under `set -e`, and main checks
# The umask is the caller's: 022 from cloud-init and the startup script on clouds (root installs
# what the cloudtrain user reads); the user's own on ssh hosts; 077 on the local provider (the
# CLI's: what it writes under CLOUDTRAIN_HOME is private).
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PYTHONUNBUFFERED=1

readonly ALL_PHASES="base nvidia-driver python torch nccl cloudtrain verify"
readonly BASE_PACKAGES="python3-venv python3-pip rsync"
readonly MIN_PYTHON=3.11
readonly VERIFY_TIMEOUT_S=300
readonly EXIT_USAGE=64 EXIT_LOCKED=69 EXIT_WAIT_WHEEL=75 EXIT_REBOOT=76 EXIT_CONFIG=78

PHASES=()      # the phases of this run, from CT_PHASES
CURRENT=""     # the phase running now
LOCK_DIR=""    # the mkdir lock we hold, if any
REPLY=""       # the result of json_str / shell_quote

say() { printf 'cloudtrain-bootstrap: %s\n' "$*"; }
die() { # die CODE MESSAGE: stop before any phase ran
  printf 'cloudtrain-bootstrap: %s\n' "$2" >&2
  exit "$1"
}
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# version_ge A B: true when dotted version A >= B (e.g. 580.65.06 >= 560.28.03).
version_ge() {
  local IFS=. i
  local -a a b
  read -ra a <<<"$1"
  read -ra b <<<"$2"
  for ((i = 0; i < ${#a[@]} || i < ${#b[@]}; i++)); do
    ((10#${a[i]:-0} > 10#${b[i]:-0})) && return 0
    ((10#${a[i]:-0} < 10#${b[i]:-0})) && return 1
  done
  return 0
}

# json_str S: REPLY = S as a JSON string literal.
json_str() {
  local s=$1 out="" c i
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/\\r}
  if [[ $s == *[[:cntrl:]]* ]]; then
    for ((i = 0; i < ${#s}; i++)); do
      c=${s:i:1}
      [[ $c == [[:cntrl:]] ]] && printf -v c '\\u%04x' "'$c"
      out+=$c
    done
    s=$out
  fi
  REPLY="\"$s\""
}

# shell_quote S: REPLY = S in single quotes, readable by sh and by Python's shlex.
shell_quote() { REPLY="'${1//\'/\'\"\'\"\'}'"; }

# write_file PATH LINE...: replace PATH atomically with the lines.
write_file() {
  local path=$1 tmp
  shift
  tmp=$(mktemp "$path.XXXXXX") || return 1
  if printf '%s\n' "$@" >"$tmp" && mv -f "$tmp" "$path"; then return 0; fi
  rm -f "$tmp"
  return 1
}

# --- configuration ---------------------------------------------------------------------------

load_config() {
  local file=$1 p seen=" "
  local -a want=()
  [[ -f $file && -r $file ]] || die "$EXIT_CONFIG" "cannot read the config file $file"
  # Only the file counts: CT_* variables inherited from the caller's environment are dropped.
  unset "${!CT_@}"
  # The file is written by cloudtrain only (see the header), so sourcing it is acceptable.
  # shellcheck source=/dev/null  # its path is known only at run time
  . "$file" || die "$EXIT_CONFIG" "cannot load the config file $file"

  [[ ${CT_ROOT:-} == /* ]] ||
    die "$EXIT_CONFIG" "CT_ROOT must be an absolute path, not '${CT_ROOT:-}'"
  CT_STATUS=${CT_STATUS:-$CT_ROOT/bootstrap/status.json}
  CT_LOG_DIR=${CT_LOG_DIR:-$CT_ROOT/bootstrap/logs}
  CT_PHASES=${CT_PHASES:-$ALL_PHASES}
  CT_INSTALL=${CT_INSTALL:-1}
  CT_PYTHON=${CT_PYTHON:-python3}
  CT_VENV=${CT_VENV:-$CT_ROOT/venv}
  CT_ACCELERATOR=${CT_ACCELERATOR:-}
  CT_GPU_COUNT=${CT_GPU_COUNT:-0}
  CT_DRIVER_BRANCH=${CT_DRIVER_BRANCH:-}
  CT_MIN_DRIVER=${CT_MIN_DRIVER:-}
  CT_TORCH_INDEX=${CT_TORCH_INDEX:-}
  CT_TORCH_VERSION=${CT_TORCH_VERSION:-}
  CT_EFA=${CT_EFA:-0}
  CT_NCCL_SOCKET_IFNAME=${CT_NCCL_SOCKET_IFNAME:-}
  CT_NCCL_ENV=${CT_NCCL_ENV:-}
  CT_CLOUDTRAIN_WHEEL=${CT_CLOUDTRAIN_WHEEL:-}
  CT_CLOUDTRAIN_VERSION=${CT_CLOUDTRAIN_VERSION:-}
  CT_LOCK_TIMEOUT=${CT_LOCK_TIMEOUT:-600}

  [[ $CT_INSTALL == [01] ]] || die "$EXIT_CONFIG" "CT_INSTALL must be 0 or 1, not '$CT_INSTALL'"
  [[ $CT_EFA == [01] ]] || die "$EXIT_CONFIG" "CT_EFA must be 0 or 1, not '$CT_EFA'"
  [[ $CT_GPU_COUNT =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_GPU_COUNT must be a number, not '$CT_GPU_COUNT'"
  [[ $CT_LOCK_TIMEOUT =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_LOCK_TIMEOUT must be seconds, not '$CT_LOCK_TIMEOUT'"
  [[ $CT_STATUS == /* && $CT_LOG_DIR == /* && $CT_VENV == /* ]] ||
    die "$EXIT_CONFIG" "CT_STATUS, CT_LOG_DIR and CT_VENV must be absolute paths"

  read -ra PHASES <<<"$CT_PHASES"
  ((${#PHASES[@]} > 0)) || die "$EXIT_CONFIG" "CT_PHASES names no phase"
  for p in "${PHASES[@]}"; do
    [[ " $ALL_PHASES " == *" $p "* ]] ||
      die "$EXIT_CONFIG" "unknown phase '$p' in CT_PHASES; phases: $ALL_PHASES"
    [[ $seen != *" $p "* ]] || die "$EXIT_CONFIG" "phase '$p' is twice in CT_PHASES"
    seen+="$p "
  done

  # What each selected phase needs, checked before anything runs.
  if [[ $seen == *" nvidia-driver "* ]] && ((CT_GPU_COUNT > 0)); then
    want+=(CT_MIN_DRIVER)
    [[ $CT_INSTALL == 1 ]] && want+=(CT_DRIVER_BRANCH)
  fi
  [[ $seen == *" torch "* && $CT_INSTALL == 1 ]] && want+=(CT_TORCH_VERSION CT_TORCH_INDEX)
  [[ $seen == *" cloudtrain "* && $CT_INSTALL == 1 ]] && want+=(CT_CLOUDTRAIN_WHEEL)
  for p in "${want[@]}"; do
    [[ -n ${!p} ]] || die "$EXIT_CONFIG" "$p is required by the phases in CT_PHASES ($CT_PHASES)"
  done
  [[ -z $CT_MIN_DRIVER || $CT_MIN_DRIVER =~ ^[0-9]+(\.[0-9]+)*$ ]] ||
    die "$EXIT_CONFIG" "CT_MIN_DRIVER must be a version like 580.65.06, not '$CT_MIN_DRIVER'"
  [[ -z $CT_DRIVER_BRANCH || $CT_DRIVER_BRANCH =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_DRIVER_BRANCH must be a number like 580, not '$CT_DRIVER_BRANCH'"

  BOOT_DIR=$CT_ROOT/bootstrap
  STATE_DIR=$BOOT_DIR/phases
}

# phase_inputs PHASE: REPLY = the config the phase depends on, as one line.
phase_inputs() {
  local -a v
  case $1 in
    base) v=("$CT_INSTALL") ;;
    nvidia-driver) v=("$CT_INSTALL" "$CT_GPU_COUNT" "$CT_DRIVER_BRANCH" "$CT_MIN_DRIVER") ;;
    python) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV") ;;
    torch) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_TORCH_VERSION" "$CT_TORCH_INDEX") ;;
    nccl)
      v=("$CT_ROOT" "$CT_GPU_COUNT" "$CT_ACCELERATOR" "$CT_EFA" "$CT_NCCL_SOCKET_IFNAME"
        "$CT_NCCL_ENV")
      ;;
    cloudtrain)
      v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_CLOUDTRAIN_WHEEL" "$CT_CLOUDTRAIN_VERSION")
      ;;
    verify) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_GPU_COUNT" "$CT_ACCELERATOR") ;;
  esac
  printf -v REPLY '%q ' "${v[@]}"
}

# --- phase records and the status file -------------------------------------------------------

# set_record PHASE STATE EXIT_CODE STARTED FINISHED ("-" for none)
set_record() {
  phase_inputs "$1"
  write_file "$STATE_DIR/$1" "$2 $3 $4 $5" "$REPLY"
}

# read_record PHASE: sets REC_STATE REC_CODE REC_STARTED REC_FINISHED REC_INPUTS.
read_record() {
  REC_STATE=pending REC_CODE=- REC_STARTED=- REC_FINISHED=- REC_INPUTS=""
  [[ -f $STATE_DIR/$1 ]] || return 0
  {
    read -r REC_STATE REC_CODE REC_STARTED REC_FINISHED
    IFS= read -r REC_INPUTS
  } <"$STATE_DIR/$1"
  return 0
}

# finished PHASE: the phase is done or skipped, for the config it has now.
finished() {
  read_record "$1"
  phase_inputs "$1"
  [[ ($REC_STATE == "done" || $REC_STATE == "skipped") && $REC_INPUTS == "$REPLY" ]]
}

# write_status STATE PHASE
write_status() {
  local json name sep="" started finished code log
  json_str "$2"
  json="{\"phase\": $REPLY, \"state\": \"$1\", \"phases\": ["
  for name in "${PHASES[@]}"; do
    read_record "$name"
    started=null finished=null code=null
    [[ $REC_STARTED != - ]] && started="\"$REC_STARTED\""
    [[ $REC_FINISHED != - ]] && finished="\"$REC_FINISHED\""
    [[ $REC_CODE =~ ^[0-9]+$ ]] && code=$REC_CODE
    json_str "$CT_LOG_DIR/$name.log"
    log=$REPLY
    json+="$sep{\"name\": \"$name\", \"state\": \"$REC_STATE\", \"started\": $started,"
    json+=" \"finished\": $finished, \"exit_code\": $code, \"log\": $log}"
    sep=", "
  done
  write_file "$CT_STATUS" "$json]}" || say "warning: cannot write $CT_STATUS" >&2
}

# --- locking -------------------------------------------------------------------------------

acquire_lock() {
  local lock=$BOOT_DIR/lock waited=0 pid held="another bootstrap run still holds"
  if command -v flock >/dev/null 2>&1; then
    exec 9>>"$lock" || die "$EXIT_CONFIG" "cannot open the lock file $lock"
    if ! flock -n 9; then
      say "another bootstrap run holds $lock; waiting up to ${CT_LOCK_TIMEOUT} s"
      flock -w "$CT_LOCK_TIMEOUT" 9 ||
        die "$EXIT_LOCKED" "$held $lock after ${CT_LOCK_TIMEOUT} s; giving up"
    fi
    return 0
  fi
  # No flock (util-linux): mkdir is atomic. A lock whose owner is gone (a reboot, kill -9) is
  # taken over; two runs finding the same stale lock at the same instant may both proceed.
  until mkdir "$lock.d" 2>/dev/null; do
    pid=$(cat "$lock.d/pid" 2>/dev/null)
    if [[ -n $pid && ! -d /proc/$pid ]]; then
      rm -rf "$lock.d"
      continue
    fi
    ((waited == 0)) && say "another bootstrap run holds $lock.d; waiting up to ${CT_LOCK_TIMEOUT} s"
    ((waited >= CT_LOCK_TIMEOUT)) &&
      die "$EXIT_LOCKED" "$held $lock.d after ${CT_LOCK_TIMEOUT} s; giving up"
    sleep 1
    ((waited += 1))
  done
  LOCK_DIR=$lock.d
  echo $$ >"$LOCK_DIR/pid"
}

release_lock() {
  [[ -n $LOCK_DIR ]] && rm -rf "$LOCK_DIR"
  LOCK_DIR=""
}

# A signal mid-phase: record the phase as failed so the status does not say "running" forever.
on_signal() {
  trap - INT TERM HUP
  if [[ -n $CURRENT ]]; then
    read_record "$CURRENT"
    set_record "$CURRENT" failed "$1" "$REC_STARTED" "$(now)"
    write_status failed "$CURRENT"
    say "$CURRENT: interrupted (exit $1)" >&2
  fi
  release_lock
  exit "$1"
}

# --- helpers for phases (they run inside the phase's subshell, under set -e) ----------------

skip() { # skip REASON: end the phase as skipped
  printf '%s\n' "$*" >"$SKIP_FILE"
  echo "skipped: $*"
  exit 0
}
fail() { # fail CODE MESSAGE...: end the phase as failed
  echo "error: ${*:2}" >&2
  exit "$1"
}
as_root() {
  if [[ $EUID -eq 0 ]]; then "$@"; else sudo -n "$@"; fi
}
apt_install() {
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600)
  echo "+ apt-get install $*"
  as_root "${apt[@]}" update
  as_root "${apt[@]}" install "$@"
}
node_python() { # the interpreter phases use: the venv's, or CT_PYTHON in check-only mode
  if [[ $CT_INSTALL == 1 ]]; then REPLY=$CT_VENV/bin/python; else REPLY=$CT_PYTHON; fi
  command -v "$REPLY" >/dev/null 2>&1 || fail 1 "no Python at $REPLY (the python phase makes it)"
}
# py_out PYTHON CODE: the last line CODE prints; when it fails, nothing (and its error to the log).
py_out() {
  local out rc=0 err=$BOOT_DIR/probe.err
  out=$("$1" -c "$2" 2>"$err") || rc=$?
  if ((rc == 0)); then
    printf '%s\n' "${out##*$'\n'}"
  else
    echo "probe '$2': $(tail -n 1 "$err")" >&2
  fi
  rm -f "$err"
}
driver_version() { # the loaded driver's version, per nvidia-smi; nothing when it does not work
  local out
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  out=$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null) ||
    return 0
  out=${out%%$'\n'*}
  out=${out//[[:space:]]/}
  [[ $out =~ ^[0-9]+(\.[0-9]+)*$ ]] && printf '%s\n' "$out"
  return 0
}
has_nvswitch() { # HGX boards (8× A100 SXM) have NVSwitches: PCI class 0680 from vendor 10de
  local out
  command -v lspci >/dev/null 2>&1 || return 1
  out=$(lspci -n -d 10de: 2>/dev/null) || return 1
  [[ $out == *" 0680: "* ]]
}
# torch_matches "VERSION CUDA": the installed torch fits CT_TORCH_VERSION and CT_TORCH_INDEX.
torch_matches() {
  local version=${1%% *} cuda=${1##* } tag want
  if [[ $CT_TORCH_VERSION =~ ^torch[[:space:]]*==[[:space:]]*([^,;[:space:]]+)$ ]]; then
    want=${BASH_REMATCH[1]}
    [[ $want == *+* ]] || version=${version%%+*}
    [[ $version == "$want" ]] || return 1
  fi
  tag=${CT_TORCH_INDEX%/}
  tag=${tag##*/}
  if [[ $tag == cpu ]]; then
    [[ $cuda == None ]] || return 1
  elif [[ $tag =~ ^cu([0-9]{2})([0-9]+)$ ]]; then
    [[ $cuda == "$((10#${BASH_REMATCH[1]})).${BASH_REMATCH[2]}" ]] || return 1
  fi
  return 0
}

# --- phases --------------------------------------------------------------------------------

phase_base() {
  local p out
  local -a missing=()
  [[ $CT_INSTALL == 1 ]] || skip "check-only mode (CT_INSTALL=0) installs no packages"
  for p in $BASE_PACKAGES; do
    if out=$(dpkg -s "$p" 2>/dev/null) && [[ $out == *"Status: install ok installed"* ]]; then
      echo "present: $p"
    else
      missing+=("$p")
    fi
  done
  ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
}

phase_nvidia_driver() {
  local have package=nvidia-driver-${CT_DRIVER_BRANCH}-server
  ((CT_GPU_COUNT > 0)) || skip "no GPU on this node"
  have=$(driver_version)
  if [[ -n $have ]] && version_ge "$have" "$CT_MIN_DRIVER"; then
    skip "NVIDIA driver $have is present (>= $CT_MIN_DRIVER)"
  fi
  [[ $CT_INSTALL == 1 ]] ||
    fail 1 "NVIDIA driver ${have:-not found}, need >= $CT_MIN_DRIVER (check-only: no install)"
  echo "NVIDIA driver ${have:-not found}, need >= $CT_MIN_DRIVER: installing $package"
  apt_install "$package"
  if has_nvswitch; then
    # NVSwitch systems need the fabric manager of the same branch, or CUDA never initialises.
    apt_install "nvidia-fabricmanager-$CT_DRIVER_BRANCH"
    as_root systemctl enable --now nvidia-fabricmanager
  fi
  as_root modprobe nvidia || echo "modprobe nvidia failed"
  have=$(driver_version)
  [[ -n $have ]] || fail "$EXIT_REBOOT" "installed $package but nvidia-smi does not work yet: \
a reboot may be needed (reboot, then run again), or Secure Boot refused the module \
(mokutil --sb-state)"
  version_ge "$have" "$CT_MIN_DRIVER" || fail "$EXIT_REBOOT" \
    "installed $package but driver $have is loaded (need >= $CT_MIN_DRIVER): a reboot may be needed"
  echo "NVIDIA driver $have"
}

phase_python() {
  local py=$CT_PYTHON version
  if [[ $CT_INSTALL == 1 ]]; then
    if [[ -x $CT_VENV/bin/python ]]; then
      echo "venv $CT_VENV exists"
    else
      echo "+ $CT_PYTHON -m venv $CT_VENV"
      "$CT_PYTHON" -m venv "$CT_VENV"
    fi
    py=$CT_VENV/bin/python
  fi
  command -v "$py" >/dev/null 2>&1 || fail 1 "Python interpreter '$py' not found"
  version=$(py_out "$py" 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ -n $version ]] || fail 1 "$py does not run"
  version_ge "$version" "$MIN_PYTHON" ||
    fail 1 "$py is Python $version; cloudtrain needs >= $MIN_PYTHON"
  echo "python $version: $py"
}

phase_torch() {
  local py info probe='import torch; print(torch.__version__, torch.version.cuda)'
  node_python
  py=$REPLY
  info=$(py_out "$py" "$probe")
  if [[ $CT_INSTALL != 1 ]]; then
    [[ -n $info ]] || fail 1 "torch is not importable by $py"
    echo "torch ${info% *}, CUDA ${info#* }"
    torch_matches "$info" ||
      echo "warning: not ${CT_TORCH_VERSION:-the pinned torch} from" \
        "${CT_TORCH_INDEX:-the expected index} (check-only mode keeps it)"
    return 0
  fi
  if [[ -n $info ]] && torch_matches "$info"; then
    echo "torch ${info% *}, CUDA ${info#* }: already installed"
    return 0
  fi
  if [[ -n $info ]]; then
    echo "replacing torch ${info% *} (CUDA ${info#* })"
    "$py" -m pip uninstall -y torch
  fi
  echo "+ pip install $CT_TORCH_VERSION --index-url $CT_TORCH_INDEX"
  "$py" -m pip install --no-input "$CT_TORCH_VERSION" --index-url "$CT_TORCH_INDEX"
  info=$(py_out "$py" "$probe")
  [[ -n $info ]] || fail 1 "torch is not importable after pip install"
  torch_matches "$info" ||
    fail 1 "pip installed torch ${info% *} (CUDA ${info#* })," \
      "not $CT_TORCH_VERSION from $CT_TORCH_INDEX"
  echo "torch ${info% *}, CUDA ${info#* }"
}

phase_nccl() {
  local out=$CT_ROOT/nccl.env
  local -a lines=("# cloudtrain: NCCL settings of this node, KEY='value' (sh, or Python's shlex).")
  if ((CT_GPU_COUNT == 0)); then
    write_file "$out" "# cloudtrain: a CPU node; gloo needs no NCCL settings."
    skip "CPU node: no NCCL settings"
  fi
  if [[ -n $CT_NCCL_SOCKET_IFNAME ]]; then
    shell_quote "$CT_NCCL_SOCKET_IFNAME"
    lines+=("NCCL_SOCKET_IFNAME=$REPLY" "GLOO_SOCKET_IFNAME=$REPLY")
  fi
  if [[ $CT_EFA == 1 ]]; then
    lines+=("FI_PROVIDER='efa'" "NCCL_PROTO='simple'")
    case $CT_ACCELERATOR in
      # p3dn's EFA has no GPUDirect RDMA; libfabric refuses FI_EFA_USE_DEVICE_RDMA=1 there.
      V100*) echo "Volta EFA instance: no GPUDirect RDMA" ;;
      *) lines+=("FI_EFA_USE_DEVICE_RDMA='1'") ;;
    esac
    [[ -d /opt/amazon/efa ]] ||
      echo "warning: no /opt/amazon/efa: NCCL needs the EFA software and aws-ofi-nccl for EFA"
  fi
  local setting
  for setting in $CT_NCCL_ENV; do
    [[ $setting =~ ^[A-Z_][A-Z0-9_]*=.*$ ]] || fail 1 "CT_NCCL_ENV: '$setting' is not KEY=value"
    shell_quote "${setting#*=}"
    lines+=("${setting%%=*}=$REPLY")
  done
  write_file "$out" "${lines[@]}"
  echo "wrote $out:"
  cat "$out"
}

phase_cloudtrain() {
  local py have probe='import cloudtrain; print(cloudtrain.__version__)'
  local want=${CT_CLOUDTRAIN_VERSION:-any version}
  node_python
  py=$REPLY
  have=$(py_out "$py" "$probe")
  if [[ -n $have && (-z $CT_CLOUDTRAIN_VERSION || $have == "$CT_CLOUDTRAIN_VERSION") ]]; then
    echo "cloudtrain $have"
    return 0
  fi
  [[ $CT_INSTALL == 1 ]] || fail 1 "$py has cloudtrain ${have:-not installed}, need $want"
  [[ -f $CT_CLOUDTRAIN_WHEEL ]] || fail "$EXIT_WAIT_WHEEL" \
    "waiting for the coordinator to copy the cloudtrain wheel to $CT_CLOUDTRAIN_WHEEL \
(installed: ${have:-none}, need: $want)"
  echo "+ pip install $CT_CLOUDTRAIN_WHEEL"
  "$py" -m pip install --no-input "$CT_CLOUDTRAIN_WHEEL"
  have=$(py_out "$py" "$probe")
  [[ -n $have && (-z $CT_CLOUDTRAIN_VERSION || $have == "$CT_CLOUDTRAIN_VERSION") ]] ||
    fail 1 "after installing $CT_CLOUDTRAIN_WHEEL cloudtrain is ${have:-not importable}, need $want"
  echo "cloudtrain $have"
}

phase_verify() {
  local py
  node_python
  py=$REPLY
  VERIFY_DIR=$(mktemp -d) # global: the subshell's EXIT trap runs after this function returned
  trap 'rm -rf "$VERIFY_DIR"' EXIT
  cat >"$VERIFY_DIR/verify.py" <<'PY'
"""cloudtrain bootstrap check. `N`: torch sees N usable GPUs (N=0: then a gloo all_reduce).
`allreduce`: one NCCL all_reduce per rank, under torch.distributed.run."""
import os
import sys

import torch
import torch.distributed as dist


def check(gpus: int) -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    if gpus == 0:
        print("CPU node: no GPU to check")
        return
    if not torch.cuda.is_available():
        sys.exit(f"torch.cuda.is_available() is False, expected {gpus} GPU(s)")
    count = torch.cuda.device_count()
    if count != gpus:
        sys.exit(f"torch sees {count} GPU(s), expected {gpus}")
    arches = torch.cuda.get_arch_list()
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        if f"sm_{major}{minor}" not in arches:
            sys.exit(f"GPU {i} is sm_{major}{minor}; this torch build has kernels for {arches}")
    print(f"{count} GPU(s): {torch.cuda.get_device_name(0)}, kernels for {arches}")


def allreduce() -> None:
    if "LOCAL_RANK" in os.environ:  # under torch.distributed.run: NCCL across this node's GPUs
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        tensor = torch.ones(1, device="cuda")
    else:  # CPU node: gloo, one process
        store = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        tensor = torch.ones(1)
    backend, world, rank = dist.get_backend(), dist.get_world_size(), dist.get_rank()
    dist.all_reduce(tensor)
    total = tensor.item()
    dist.destroy_process_group()
    if total != world:
        sys.exit(f"{backend} all_reduce gave {total}, expected {world}")
    if rank == 0:
        print(f"{backend} all_reduce across {world} process(es): ok")


if __name__ == "__main__":
    if sys.argv[1] == "allreduce":
        allreduce()
    else:
        check(int(sys.argv[1]))
        if sys.argv[1] == "0":
            allreduce()  # in the same process: importing torch is most of the time
PY
  # CPU: one process checks and all-reduces. GPU: check, then one rank per GPU all-reduces.
  timeout "$VERIFY_TIMEOUT_S" "$py" "$VERIFY_DIR/verify.py" "$CT_GPU_COUNT"
  if ((CT_GPU_COUNT > 0)); then
    timeout "$VERIFY_TIMEOUT_S" "$py" -m torch.distributed.run --standalone \
      --nproc-per-node "$CT_GPU_COUNT" "$VERIFY_DIR/verify.py" allreduce
  fi
}

# --- main ----------------------------------------------------------------------------------

# run_phase PHASE: run it in a subshell under set -e, logged and recorded; returns its exit code.
run_phase() {
  local name=$1 log=$CT_LOG_DIR/$1.log skip_file=$BOOT_DIR/skipped.$1 started t0 rc state
  started=$(now)
  t0=$SECONDS
  CURRENT=$name
  set_record "$name" running - "$started" -
  write_status running "$name"
  rm -f "$skip_file"
  printf '==== %s: phase %s (CT_INSTALL=%s)\n' "$started" "$name" "$CT_INSTALL" >>"$log"
  (
    set -e
    SKIP_FILE=$skip_file
    "phase_${name//-/_}"
  ) >>"$log" 2>&1 </dev/null
  rc=$?
  state="done"
  if ((rc != 0)); then
    state=failed
  elif [[ -f $skip_file ]]; then
    state=skipped
  fi
  set_record "$name" "$state" "$rc" "$started" "$(now)"
  CURRENT=""
  if [[ $state == failed ]]; then
    write_status failed "$name"
    say "$name: failed (exit $rc, $((SECONDS - t0)) s); the end of $log:" >&2
    tail -n 20 "$log" | sed 's/^/  | /' >&2
  elif [[ $state == skipped ]]; then
    say "$name: skipped, $(<"$skip_file") ($((SECONDS - t0)) s)"
  else
    say "$name: done ($((SECONDS - t0)) s)"
  fi
  rm -f "$skip_file"
  return "$rc"
}

main() {
  local i start=-1 rc
  (($# <= 1)) ||
    die "$EXIT_USAGE" "usage: bootstrap.sh [CONFIG]  (default /etc/cloudtrain/bootstrap.env)"
  load_config "${1:-/etc/cloudtrain/bootstrap.env}"
  mkdir -p "$STATE_DIR" "$CT_LOG_DIR" "${CT_STATUS%/*}" ||
    die "$EXIT_CONFIG" "cannot create the folders under $CT_ROOT"
  cd / || die "$EXIT_CONFIG" "cannot cd /" # a package in the caller's folder must not shadow torch
  acquire_lock
  trap release_lock EXIT
  trap 'on_signal 129' HUP
  trap 'on_signal 130' INT
  trap 'on_signal 143' TERM

  for i in "${!PHASES[@]}"; do
    if ! finished "${PHASES[i]}"; then
      start=$i
      break
    fi
  done
  if ((start < 0)); then
    write_status ready "${PHASES[-1]}"
    say "ready: every phase already done ($CT_PHASES)"
    return 0
  fi
  for ((i = start; i < ${#PHASES[@]}; i++)); do
    set_record "${PHASES[i]}" pending - - -
  done
  ((start > 0)) && say "resuming at ${PHASES[start]}"
  for ((i = start; i < ${#PHASES[@]}; i++)); do
    run_phase "${PHASES[i]}"
    rc=$?
    ((rc == 0)) || return "$rc"
  done
  write_status ready "${PHASES[-1]}"
  say "ready"
  return 0
}

main "$@"
