#!/usr/bin/env bash
# Stand-in for the system commands bootstrap.sh calls (apt-get, dpkg, nvidia-smi, lspci, modprobe,
# systemctl, sudo). Tests link it under those names. Every call appends "NAME ARGS" to
# $STUB_STATE/calls.log; the state it reads and writes lives in $STUB_STATE:
#   fail.NAME       make NAME exit with the code in the file (empty: 1)
#   dpkg/PKG        PKG is installed (apt-get install creates it)
#   driver          the driver version nvidia-smi prints; no file: nvidia-smi fails
#   driver-after    the driver version nvidia-smi prints once apt-get installed a driver
#   gpus            how many GPUs nvidia-smi lists (default 1)
#   lspci           what `lspci -n -d 10de:` prints
set -u
name=${0##*/}
state=${STUB_STATE:?STUB_STATE is not set}
printf '%s\n' "$name $*" >>"$state/calls.log"
if [[ -f $state/fail.$name ]]; then
  code=$(<"$state/fail.$name")
  echo "$name: failing on purpose" >&2
  exit "${code:-1}"
fi
case $name in
  sudo)
    [[ ${1:-} == -n ]] && shift
    exec "$@"
    ;;
  apt-get)
    [[ " $* " == *" install "* ]] || exit 0
    mkdir -p "$state/dpkg"
    for arg in "$@"; do
      case $arg in
        -* | install | DPkg::* | *=*) ;;
        *)
          touch "$state/dpkg/$arg"
          if [[ $arg == nvidia-driver-* && -f $state/driver-after ]]; then
            cp "$state/driver-after" "$state/driver"
          fi
          ;;
      esac
    done
    ;;
  dpkg)
    pkg=${!#}
    if [[ -f $state/dpkg/$pkg ]]; then
      printf 'Package: %s\nStatus: install ok installed\n' "$pkg"
    else
      echo "dpkg-query: package '$pkg' is not installed" >&2
      exit 1
    fi
    ;;
  nvidia-smi)
    if [[ ! -f $state/driver ]]; then
      echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
      exit 9
    fi
    version=$(<"$state/driver")
    for ((i = 0; i < $(cat "$state/gpus" 2>/dev/null || echo 1); i++)); do echo "$version"; done
    ;;
  lspci)
    [[ -f $state/lspci ]] && cat "$state/lspci"
    ;;
esac
exit 0
