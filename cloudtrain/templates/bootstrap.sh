#!/usr/bin/env bash
# cloudtrain node bootstrap: every phase, from what needs root before a Python exists (base
# packages, the NVIDIA driver, the venv) and cloudtrain's wheel, to torch, the NCCL settings and
# the check that both work. This script alone runs the phases, keeps their records, writes the
# status file and holds the lock; the phases that need the node's Python (torch, nccl, verify)
# it runs as `python -m cloudtrain.node.bootstrap phase NAME ...` from the wheel the cloudtrain
# phase installed. Static: the node's settings are in CONFIG.
#
# Usage:  bootstrap.sh [CONFIG]        CONFIG defaults to /etc/cloudtrain/bootstrap.env
#
# Run it as the user that owns CT_ROOT (the node's `cloudtrain` user) or as root; it uses
# `sudo -n` for apt-get, modprobe and systemctl only (nothing when it runs as root).
#
# CONFIG holds KEY=VALUE lines, values quoted by Python's shlex.quote; cloudtrain alone writes
# it, so it is sourced: never point it at a file anyone else can write. CT_* variables in the
# environment are ignored. Keys [default]:
#   CT_ROOT                the node's cloudtrain folder (required, absolute)
#   CT_STATUS, CT_LOG_DIR  [$CT_ROOT/bootstrap/status.json], [$CT_ROOT/bootstrap/logs]
#   CT_PHASES              the phases to run; they run in the order below  [all]
#   CT_INSTALL             1: install what is missing; 0: check only  [1]
#   CT_PYTHON              the interpreter when CT_INSTALL=0; makes the venv when 1  [python3]
#   CT_VENV                the venv made when CT_INSTALL=1  [$CT_ROOT/venv]
#   CT_ACCELERATOR, CT_GPU_COUNT  the GPU (V100, A100 ...; empty for CPU) and how many [0]
#   CT_DRIVER_BRANCH, CT_MIN_DRIVER  apt nvidia-driver-<branch>-server; the lowest driver
#   CT_TORCH_INDEX, CT_TORCH_VERSION  pip --index-url and requirement for torch
#   CT_EFA                 1 on instances with an Elastic Fabric Adapter  [0]
#   CT_NCCL_SOCKET_IFNAME, CT_NCCL_ENV  NCCL's interface; the fabric's KEY=value settings
#   CT_CLOUDTRAIN_WHEEL    where the coordinator puts its cloudtrain wheel on this node
#   CT_CLOUDTRAIN_VERSION  the cloudtrain version the node must have (optional)
#   CT_LOCK_TIMEOUT        seconds a second run waits for the first one  [600]
#   CT_WHEEL_TIMEOUT       seconds the cloudtrain phase waits for the wheel  [1800]
#   CT_AGENT               "detached": start the node agent before saying ready (ssh and local
#                          nodes; systemd runs it on clouds)  [none]
#   CT_VERIFIED_BY         set: the verify phase is skipped, this machine having been verified
#                          by the node it names (a local cluster's nodes are one machine)  [none]
#   CT_WARM                0: a CPU node's verify phase starts no warm server  [1]
#
# Phases (each idempotent, timed, logged to $CT_LOG_DIR/<phase>.log; "check:" is CT_INSTALL=0):
#   base           apt-get install python3-venv python3-pip rsync, those missing. check: skipped
#   nvidia-driver  skipped on CPU and when nvidia-smi shows a driver >= CT_MIN_DRIVER; else
#                  nvidia-driver-<branch>-server (+ fabric manager on NVSwitch boards).
#                  check: fails unless such a driver is there
#   python         the venv (Python >= 3.11). check: CT_PYTHON is Python >= 3.11
#   cloudtrain     pip install CT_CLOUDTRAIN_WHEEL unless CT_CLOUDTRAIN_VERSION is there. No
#                  wheel yet: the state is "waiting" (below) until the coordinator has copied it
#                  there (atomically), for CT_WHEEL_TIMEOUT s at most. check: it imports, that
#                  version
#   torch, nccl, verify   in the node's Python: cloudtrain/node/bootstrap.py says what they do
#
# Status: $CT_STATUS, rewritten atomically at every change, by this script alone:
#   {"phase": "<phase>", "state": "running"|"waiting"|"ready"|"failed",
#    "phases": [{"name", "state": "pending"|"running"|"waiting"|"done"|"skipped"|"failed",
#                "started", "finished": "<UTC ISO 8601>"|null, "exit_code": <int>|null, "log"}]}
# and, in the state "waiting": "waiting_for": "wheel", "wheel": "<where to put it>".
# One record per phase in $CT_ROOT/bootstrap/phases/ ("STATE CODE STARTED FINISHED" and the
# config it ran with) is the truth behind it: a run starts at the first phase not done for the
# config it has now, and redoes every phase after it. Runs are serialised by flock on
# $CT_ROOT/bootstrap/lock (mkdir where flock is missing).
#
# Exit codes: 0 ready; otherwise the failed phase's, in particular
#   76 nvidia-driver installed but not loaded (reboot, then run again), 124 verify timed out,
#   129, 130, 143 SIGHUP, SIGINT, SIGTERM (the running phase is recorded as failed);
# before any phase runs (the status file is left as it is): 64 usage, 69 the lock was held for
#   CT_LOCK_TIMEOUT seconds, 78 bad config.

set -u -o pipefail # no `set -e`: each phase runs in a subshell under `set -e`, and main checks
# The umask is the caller's (022 from cloud-init; 077 from cloudtrain's executors: ssh hosts
# and the local provider), but for what `as_root` does to the whole machine.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PYTHONUNBUFFERED=1

readonly ALL_PHASES="base nvidia-driver python cloudtrain torch nccl verify"
readonly PY_PHASES="torch nccl verify" # run in the node's Python, by PY_MODULE
readonly PY_MODULE=cloudtrain.node.bootstrap
readonly BASE_PACKAGES="python3-venv python3-pip rsync"
readonly MIN_PYTHON=3.11
readonly EXIT_USAGE=64 EXIT_LOCKED=69 EXIT_REBOOT=76 EXIT_CONFIG=78

PHASES=()   # the phases of this run, in ALL_PHASES order
CONFIG=""   # the config file
CURRENT=""  # the phase running now
PHASE_PID="" # the process running it
LOCK_DIR="" # the mkdir lock we hold, if any
REPLY=""    # the result of json_str and phase_inputs

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
  local -a need=() asked=()
  [[ -f $file && -r $file ]] || die "$EXIT_CONFIG" "cannot read the config file $file"
  unset "${!CT_@}" # only the file counts
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
  CT_GPU_COUNT=${CT_GPU_COUNT:-0}
  CT_DRIVER_BRANCH=${CT_DRIVER_BRANCH:-}
  CT_MIN_DRIVER=${CT_MIN_DRIVER:-}
  CT_TORCH_INDEX=${CT_TORCH_INDEX:-}
  CT_TORCH_VERSION=${CT_TORCH_VERSION:-}
  CT_EFA=${CT_EFA:-0}
  CT_CLOUDTRAIN_WHEEL=${CT_CLOUDTRAIN_WHEEL:-}
  CT_CLOUDTRAIN_VERSION=${CT_CLOUDTRAIN_VERSION:-}
  CT_LOCK_TIMEOUT=${CT_LOCK_TIMEOUT:-600}
  CT_WHEEL_TIMEOUT=${CT_WHEEL_TIMEOUT:-1800}
  CT_ACCELERATOR=${CT_ACCELERATOR:-}
  CT_NCCL_SOCKET_IFNAME=${CT_NCCL_SOCKET_IFNAME:-}
  CT_NCCL_ENV=${CT_NCCL_ENV:-}
  CT_AGENT=${CT_AGENT:-}

  [[ $CT_INSTALL == [01] ]] || die "$EXIT_CONFIG" "CT_INSTALL must be 0 or 1, not '$CT_INSTALL'"
  [[ $CT_EFA == [01] ]] || die "$EXIT_CONFIG" "CT_EFA must be 0 or 1, not '$CT_EFA'"
  [[ $CT_GPU_COUNT =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_GPU_COUNT must be a number, not '$CT_GPU_COUNT'"
  [[ $CT_LOCK_TIMEOUT =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_LOCK_TIMEOUT must be seconds, not '$CT_LOCK_TIMEOUT'"
  [[ $CT_WHEEL_TIMEOUT =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_WHEEL_TIMEOUT must be seconds, not '$CT_WHEEL_TIMEOUT'"
  [[ $CT_STATUS == /* && $CT_LOG_DIR == /* && $CT_VENV == /* ]] ||
    die "$EXIT_CONFIG" "CT_STATUS, CT_LOG_DIR and CT_VENV must be absolute paths"

  read -ra asked <<<"$CT_PHASES"
  ((${#asked[@]} > 0)) || die "$EXIT_CONFIG" "CT_PHASES names no phase"
  for p in "${asked[@]}"; do
    [[ " $ALL_PHASES " == *" $p "* ]] ||
      die "$EXIT_CONFIG" "unknown phase '$p' in CT_PHASES; phases: $ALL_PHASES"
    [[ $seen != *" $p "* ]] || die "$EXIT_CONFIG" "phase '$p' is twice in CT_PHASES"
    seen+="$p "
  done
  for p in $ALL_PHASES; do [[ $seen == *" $p "* ]] && PHASES+=("$p"); done

  # What each selected phase needs, checked before anything runs.
  if [[ $seen == *" nvidia-driver "* ]] && ((CT_GPU_COUNT > 0)); then
    need+=(CT_MIN_DRIVER)
    [[ $CT_INSTALL == 1 ]] && need+=(CT_DRIVER_BRANCH)
  fi
  [[ $seen == *" torch "* && $CT_INSTALL == 1 ]] && need+=(CT_TORCH_VERSION CT_TORCH_INDEX)
  [[ $seen == *" cloudtrain "* && $CT_INSTALL == 1 ]] && need+=(CT_CLOUDTRAIN_WHEEL)
  for p in "${need[@]}"; do
    [[ -n ${!p} ]] || die "$EXIT_CONFIG" "$p is required by the phases in CT_PHASES ($CT_PHASES)"
  done
  [[ -z $CT_MIN_DRIVER || $CT_MIN_DRIVER =~ ^[0-9]+(\.[0-9]+)*$ ]] ||
    die "$EXIT_CONFIG" "CT_MIN_DRIVER must be a version like 580.65.06, not '$CT_MIN_DRIVER'"
  [[ -z $CT_DRIVER_BRANCH || $CT_DRIVER_BRANCH =~ ^[0-9]+$ ]] ||
    die "$EXIT_CONFIG" "CT_DRIVER_BRANCH must be a number like 580, not '$CT_DRIVER_BRANCH'"

  BOOT_DIR=$CT_ROOT/bootstrap
  STATE_DIR=$BOOT_DIR/phases
}

# phase_inputs PHASE: REPLY = the config a phase depends on, as one line: a change redoes it.
phase_inputs() {
  local -a v=()
  case $1 in
    base) v=("$CT_INSTALL") ;;
    nvidia-driver) v=("$CT_INSTALL" "$CT_GPU_COUNT" "$CT_DRIVER_BRANCH" "$CT_MIN_DRIVER") ;;
    python) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV") ;;
    cloudtrain)
      v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_CLOUDTRAIN_WHEEL" "$CT_CLOUDTRAIN_VERSION")
      ;;
    torch) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_TORCH_VERSION" "$CT_TORCH_INDEX") ;;
    nccl)
      v=("$CT_ROOT" "$CT_GPU_COUNT" "$CT_ACCELERATOR" "$CT_EFA" "$CT_NCCL_SOCKET_IFNAME" "$CT_NCCL_ENV")
      ;;
    verify) v=("$CT_INSTALL" "$CT_PYTHON" "$CT_VENV" "$CT_GPU_COUNT" "$CT_ACCELERATOR") ;;
  esac
  REPLY=""
  ((${#v[@]} == 0)) || printf -v REPLY '%q ' "${v[@]}"
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
  json="{\"phase\": $REPLY, \"state\": \"$1\", "
  if [[ $1 == waiting ]]; then
    json_str "$CT_CLOUDTRAIN_WHEEL"
    json+="\"waiting_for\": \"wheel\", \"wheel\": $REPLY, "
  fi
  json+="\"phases\": ["
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

# A signal mid-phase: a Python phase, or the cloudtrain phase waiting for the wheel, is passed
# SIGTERM (the first kills what it runs; the second only sleeps); any other shell phase is left
# to end with the command it runs (apt-get, pip), as a signal to a foreground phase would.
# Either is waited for, and the phase is recorded as failed so the status does not say
# "running" forever.
on_signal() {
  trap - INT TERM HUP
  if [[ -n $PHASE_PID ]]; then
    read_record "$CURRENT"
    if [[ " $PY_PHASES " == *" $CURRENT "* || $REC_STATE == waiting ]]; then
      kill -TERM "$PHASE_PID" 2>/dev/null
    fi
    wait "$PHASE_PID"
  fi
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
as_root() { # system-wide (packages, units): for every user of the machine, under umask 022
  (
    umask 022
    if [[ $EUID -eq 0 ]]; then "$@"; else sudo -n "$@"; fi
  )
}
apt_install() {
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600)
  echo "+ apt-get install $*"
  as_root "${apt[@]}" update
  as_root "${apt[@]}" install "$@"
}
python_path() { # REPLY = the node's Python: the venv's, or CT_PYTHON in check-only mode
  if [[ $CT_INSTALL == 1 ]]; then REPLY=$CT_VENV/bin/python; else REPLY=$CT_PYTHON; fi
}
node_python() { # python_path, for a phase: one that is not there fails it
  python_path
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
# py_phase NAME: the phase, in the node's Python. The process becomes it (exec), so that a
# signal reaches it; its exit code is the phase's, and a reason it writes to SKIP_FILE skips it.
py_phase() {
  node_python
  exec "$REPLY" -m "$PY_MODULE" phase "$1" "$CONFIG" "$SKIP_FILE"
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

# wait_for_wheel WHY: the status says "waiting" (with where the wheel goes) until the coordinator
# has copied it there, then "running" again; no wheel in CT_WHEEL_TIMEOUT s fails the phase.
wait_for_wheel() {
  local t0=$SECONDS
  echo "waiting up to $CT_WHEEL_TIMEOUT s for the coordinator to copy the cloudtrain wheel to \
$CT_CLOUDTRAIN_WHEEL ($1)"
  set_record cloudtrain waiting - "$PHASE_STARTED" -
  write_status waiting cloudtrain
  until [[ -f $CT_CLOUDTRAIN_WHEEL ]]; do
    ((SECONDS - t0 < CT_WHEEL_TIMEOUT)) ||
      fail 1 "no cloudtrain wheel at $CT_CLOUDTRAIN_WHEEL after $CT_WHEEL_TIMEOUT s"
    sleep 1
  done
  set_record cloudtrain running - "$PHASE_STARTED" -
  write_status running cloudtrain
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
  [[ -f $CT_CLOUDTRAIN_WHEEL ]] || wait_for_wheel "installed: ${have:-none}, need: $want"
  echo "+ pip install $CT_CLOUDTRAIN_WHEEL"
  "$py" -m pip install --no-input "$CT_CLOUDTRAIN_WHEEL"
  have=$(py_out "$py" "$probe")
  [[ -n $have && (-z $CT_CLOUDTRAIN_VERSION || $have == "$CT_CLOUDTRAIN_VERSION") ]] ||
    fail 1 "after installing $CT_CLOUDTRAIN_WHEEL cloudtrain is ${have:-not importable}, need $want"
  echo "cloudtrain $have"
}

phase_torch() { py_phase torch; }
phase_nccl() { py_phase nccl; }
phase_verify() { py_phase verify; }

# --- main ----------------------------------------------------------------------------------

# run_phase PHASE: run it in a subshell under set -e, logged and recorded; returns its exit code.
# The subshell runs in the background and is waited for: a signal then reaches on_signal at once,
# not when the phase ends.
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
    SKIP_FILE=$skip_file PHASE_STARTED=$started
    "phase_${name//-/_}"
  ) >>"$log" 2>&1 </dev/null &
  PHASE_PID=$!
  wait "$PHASE_PID"
  rc=$?
  PHASE_PID="" CURRENT=""
  state="done"
  if ((rc != 0)); then
    state=failed
  elif [[ -f $skip_file ]]; then
    state=skipped
  fi
  set_record "$name" "$state" "$rc" "$started" "$(now)"
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

# start_agent: on ssh and local nodes (CT_AGENT=detached) the node agent, started unless it runs
# already, before the node says ready; one that does not start is only a warning (the node's
# heartbeat starts it later).
start_agent() {
  [[ $CT_AGENT == detached ]] || return 0
  python_path
  if "$REPLY" -m cloudtrain.node agent --root "$CT_ROOT" --ensure --wait 10 >/dev/null </dev/null; then
    say "agent: running"
  else
    say "agent: did not start" >&2
  fi
}

main() {
  local i start=-1 rc
  (($# <= 1)) ||
    die "$EXIT_USAGE" "usage: bootstrap.sh [CONFIG]  (default /etc/cloudtrain/bootstrap.env)"
  CONFIG=${1:-/etc/cloudtrain/bootstrap.env}
  load_config "$CONFIG"
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
  if ((start >= 0)); then
    for ((i = start; i < ${#PHASES[@]}; i++)); do
      set_record "${PHASES[i]}" pending - - -
    done
    ((start > 0)) && say "resuming at ${PHASES[start]}"
    for ((i = start; i < ${#PHASES[@]}; i++)); do
      run_phase "${PHASES[i]}"
      rc=$?
      ((rc == 0)) || return "$rc"
    done
  fi
  start_agent
  write_status ready "${PHASES[-1]}"
  if ((start < 0)); then
    say "ready: every phase already done ($CT_PHASES)"
  else
    say "ready"
  fi
  return 0
}

main "$@"
