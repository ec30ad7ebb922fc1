# Sourced by the scripts: tfos_cache_dir prints this user's private cache directory for builds and
# downloads (${TFOS_CACHE_DIR:-~/.cache/tfos}), made 0700 and refused when it is a symlink or not ours.
tfos_cache_dir() {  # this user's private cache (0700, owned by us, not a symlink)
  local dir="${TFOS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tfos}"
  mkdir -p "$dir"
  if [ -L "$dir" ] || [ "$(stat -c %u "$dir")" != "$(id -u)" ]; then
    echo "tfos cache $dir is a symlink or not owned by $(id -un): set TFOS_CACHE_DIR to a directory of yours" >&2
    exit 1
  fi
  chmod 700 "$dir"
  echo "$dir"
}
