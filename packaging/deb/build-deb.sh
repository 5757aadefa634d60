#!/usr/bin/env bash
# Build the edgefleet-agent Debian package with dpkg-deb: the agent and its dependencies in a
# virtual environment under /opt/edgefleet/venv, the systemd unit, a default config
# (/etc/edgefleet/agent.toml, a conffile) and maintainer scripts that create the edgefleet
# system user. Run it on the architecture it is for (amd64 or arm64; the venv holds native
# wheels): on a device, in a container of that architecture, or under QEMU (docs/packaging.md).
#
#   packaging/deb/build-deb.sh [--wheel FILE] [--out DIR] [--python PATH] [--pip CMD]
#       [--extras openvino] [--revision N] [--compression xz|zstd|gzip|none] [--level N]
#       [-- PIP_INSTALL_ARGS...]     e.g. -- --no-index --find-links ./wheelhouse
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
wheel="" out="$project/dist" python=/usr/bin/python3 pip="pip3" extras=""
revision=1 compression=xz level=6 arch=""
pip_args=()

while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --pip) pip=$2; shift 2 ;;
        --extras) extras=$2; shift 2 ;;
        --revision) revision=$2; shift 2 ;;
        --compression) compression=$2; shift 2 ;;
        --level) level=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --) shift; pip_args=("$@"); break ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "build-deb.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

umask 022
mkdir -p "$out"
out=$(cd "$out" && pwd)
arch=${arch:-$(dpkg --print-architecture)}
stage=$(mktemp -d "${TMPDIR:-/tmp}/edgefleet-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT

if [ -z "$wheel" ]; then
    "$python" -m build --wheel --outdir "$stage/wheel" "$project"
    wheel=$(ls "$stage"/wheel/edgefleet-*.whl)
fi
version=$(basename "$wheel" | cut -d- -f2)
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
root="$stage/root"
venv="$root/opt/edgefleet/venv"

# The venv is made by the target's interpreter (Debian's python3), without pip: the package
# is upgraded as a whole, never with pip inside it.
"$python" -m venv --without-pip "$venv"
spec="$wheel"
[ -n "$extras" ] && spec="${wheel}[${extras}]"
# shellcheck disable=SC2086  # $pip may be a command with arguments ("python3 -m pip")
$pip --python "$venv/bin/python" install --quiet --no-compile --no-warn-script-location \
    "${pip_args[@]}" "$spec"

# Relocate: scripts and pyvenv.cfg name the staging path; on the device it is /opt/edgefleet.
grep -rlI --null -F "$root" "$venv/bin" "$venv/pyvenv.cfg" | xargs -0 -r sed -i "s|$root||g"
# Byte-compile now, with the installed path in tracebacks: /opt is read-only to the service.
# A third-party file that does not compile (a template, a test fixture) is reported and left
# as it is; one of edgefleet's own is an error.
if ! "$venv/bin/python" -m compileall -q -j 0 -s "$root" -p / "$venv/lib" >"$stage/compile.log"; then
    grep -F "Error compiling" "$stage/compile.log" >&2 || true
    if grep -qE "site-packages/(agent|control_plane|runtimes)/" "$stage/compile.log"; then
        echo "build-deb.sh: edgefleet's own code does not compile" >&2
        exit 1
    fi
fi

install -D -m 0644 "$project/packaging/systemd/edgefleet-agent.service" \
    "$root/usr/lib/systemd/system/edgefleet-agent.service"
install -D -m 0644 "$here/agent.toml" "$root/etc/edgefleet/agent.toml"
install -D -m 0644 "$here/copyright" "$root/usr/share/doc/edgefleet-agent/copyright"
install -D -m 0644 "$project/README.md" "$root/usr/share/doc/edgefleet-agent/README.md"
install -d "$root/usr/bin"
ln -s /opt/edgefleet/venv/bin/edgefleet "$root/usr/bin/edgefleet"

install -d "$root/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
echo /etc/edgefleet/agent.toml >"$root/DEBIAN/conffiles"
installed_kib=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: edgefleet-agent
Version: $version-$revision
Architecture: $arch
Maintainer: edgefleet maintainers <maintainers@edgefleet.invalid>
Installed-Size: $installed_kib
Depends: python$pyver, passwd
Recommends: systemd
Section: misc
Priority: optional
Description: edgefleet edge inference agent
 Serves local inference (KServe V2 and TF Serving REST) on the best runtime
 and device of this machine (ONNX Runtime, LiteRT${extras:+, $extras}) and follows
 the fleet's signed, staged rollouts over MQTT. Runs as the edgefleet-agent
 systemd service under the edgefleet system user.
EOF

chmod -R u+rwX,go+rX,go-w "$root"
deb="$out/edgefleet-agent_${version}-${revision}_${arch}.deb"
dpkg-deb --root-owner-group "-Z$compression" "-z$level" --build "$root" "$deb" >/dev/null
echo "$deb"
