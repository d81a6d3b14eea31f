#!/usr/bin/env bash
# images.sh builds the local images that the tests and the demo use, with no
# registry: root filesystems come from Debian packages fetched through the
# apt mirror this machine is configured with.
#
#   opensandbox/base:bookworm   Debian minbase (debootstrap), then docker import
#   opensandbox/python:3.11     the same plus python3
#   opensandbox/code-interpreter
#                               the same plus numpy, pandas, matplotlib, nodejs
#                               with typescript, a JDK (JShell), Go and bash:
#                               the image of the code interpreter, with its
#                               entrypoint script (scripts/code-interpreter)
#                               on top of the root file system
#                               opensandbox/code-interpreter:rootfs, which
#                               carries the SHA-256 of its package list as a
#                               label and is rebuilt when the list changes
#   opensandbox/busybox         busybox-static with its applet links (~2 MB)
#   opensandbox/noshell         busybox-static alone, without any shell link:
#                               an image in which no shell exists
#   opensandbox/execd           FROM scratch + /execd (bin/execd): what a
#                               Kubernetes sandbox pod's init container copies
#                               execd from (`/execd --install-to PATH`)
#   opensandbox/egress          FROM scratch + /osb-egress (bin/osb-egress)
#                               and Debian's root certificates:
#                               the egress enforcer beside every sandbox that
#                               has a network policy
#   opensandbox/server          FROM scratch + /opensandbox-server
#                               (bin/opensandbox-server), an empty /tmp, user
#                               65532: the lifecycle server in a cluster
#   opensandbox/ingress         FROM scratch + /osb-ingress (bin/osb-ingress)
#                               and Debian's root certificates, user 65532:
#                               the ingress gateway
#
# The last four are made from the static binaries `make build` leaves in bin/
# and carry the binary's SHA-256 as a label: they are rebuilt when the binary
# changed, which takes about a second.
#
# An image that already exists is kept, so a second run takes seconds.
# FORCE=1 rebuilds everything. Work files live in .cache/images (git-ignored).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache=${OSB_IMAGE_CACHE:-$top/.cache/images}
suite=bookworm

log() { printf 'images: %s\n' "$*" >&2; }

have_image() { [[ ${FORCE:-0} != 1 ]] && docker image inspect "$1" >/dev/null 2>&1; }

# debian_mirror prints the URI of the Debian archive that apt uses for $suite,
# read from deb822 .sources files or one-line sources.list entries.
debian_mirror() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		uri=$(awk -v suite="$suite" '
			BEGIN { RS = ""; FS = "\n" }
			{
				uris = ""; ok = 0
				for (i = 1; i <= NF; i++) {
					if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
					if ($i ~ /^Suites:/ && $i ~ ("[ \t]" suite "([ \t]|$)")) ok = 1
				}
				if (ok && uris != "") { print uris; exit }
			}' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		uri=$(awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i+1) == suite) { print $i; exit } }' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
	log "no apt source for Debian $suite found in /etc/apt"
	return 1
}

ensure_tools() {
	local missing=()
	command -v debootstrap >/dev/null || missing+=(debootstrap)
	[[ $(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null) == *' installed' ]] || missing+=(busybox-static)
	# osb-egress verifies the credential proxy's upstream servers against
	# Debian's roots, copied into its image.
	[[ -s /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
	if ((${#missing[@]})); then
		log "installing ${missing[*]} from Debian"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
}

# bootstrap IMAGE INCLUDE TAG [APT_PACKAGES [LABEL]] makes a minbase root
# file system with the packages INCLUDE (comma-separated, resolved by
# debootstrap) and APT_PACKAGES (comma-separated, installed with apt
# without recommends), imports it as IMAGE (with LABEL, key=value, when
# given) and removes the tree.
bootstrap() {
	local image=$1 include=$2 dir="$cache/rootfs-$3" label=${5:-}
	local mirror
	mirror=$(debian_mirror)
	log "debootstrap $suite from $mirror for $image"
	# A run killed while /proc was mounted in the tree leaves it there.
	umount "$dir/proc" 2>/dev/null || true
	rm -rf --one-file-system "$dir"
	mkdir -p "$cache/debs"
	debootstrap --variant=minbase --cache-dir="$cache/debs" ${include:+--include="$include"} \
		"$suite" "$dir" "$mirror" >"$cache/debootstrap-$3.log" 2>&1 || {
		tail -n 20 "$cache/debootstrap-$3.log" >&2
		return 1
	}
	# Further packages through apt inside the tree, without recommends:
	# debootstrap's own resolver drags in far more than apt would.
	if [[ -n ${4:-} ]]; then
		log "apt-get install $4 into $image"
		cp /etc/resolv.conf "$dir/etc/resolv.conf"
		# The JDK's post-installation script runs java, which needs /proc.
		mount -t proc proc "$dir/proc"
		chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$cache/debootstrap-$3.log" 2>&1 &&
			chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				${4//,/ } >>"$cache/debootstrap-$3.log" 2>&1 || {
			umount "$dir/proc"
			tail -n 20 "$cache/debootstrap-$3.log" >&2
			return 1
		}
		umount "$dir/proc"
		chroot "$dir" apt-get clean
		: >"$dir/etc/resolv.conf"
	fi
	# Trim what a container never needs.
	rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* \
		"$dir"/usr/share/man/* "$dir"/usr/share/info/*
	tar -C "$dir" --numeric-owner -c . | docker import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV LANG=C.UTF-8' \
		--change 'CMD ["/bin/bash"]' \
		${label:+--change "LABEL $label"} \
		- "$image" >/dev/null
	rm -rf "$dir"
	log "built $image"
}

busybox_images() {
	local dir="$cache/busybox"
	rm -rf "$dir"
	mkdir -p "$dir/bin" "$dir/tmp" "$dir/etc" "$dir/root"
	cp /bin/busybox "$dir/bin/busybox"
	chmod 1777 "$dir/tmp"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$dir/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/etc/group"
	if ! have_image opensandbox/noshell; then
		tar -C "$dir" --numeric-owner -c . | docker import \
			--change 'ENV PATH=/bin' --change 'CMD ["/bin/busybox"]' - opensandbox/noshell >/dev/null
		log "built opensandbox/noshell"
	fi
	if ! have_image opensandbox/busybox; then
		local applet
		for applet in $(/bin/busybox --list); do
			[[ $applet == busybox ]] || ln -s busybox "$dir/bin/$applet"
		done
		tar -C "$dir" --numeric-owner -c . | docker import \
			--change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - opensandbox/busybox >/dev/null
		log "built opensandbox/busybox"
	fi
	rm -rf "$dir"
}

# binary_image IMAGE BINARY USER [FILE...]: IMAGE holds only bin/BINARY at
# /BINARY (its entrypoint), an empty /tmp and each FILE of this machine at the
# same path (root certificates), and runs as USER. It is rebuilt when the
# binary's SHA-256 differs from the one in the image's label.
binary_image() {
	local image=$1 name=$2 user=$3 src=$top/bin/$2 sum dir old f
	shift 3
	[[ -x $src ]] || { log "$src is missing; run make build first"; return 1; }
	sum=$(sha256sum "$src" | cut -d' ' -f1)
	if [[ ${FORCE:-0} != 1 ]] &&
		[[ $(docker image inspect --format '{{index .Config.Labels "io.opensandbox.binary.sha256"}}' "$image" 2>/dev/null) == "$sum" ]]; then
		return
	fi
	old=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
	dir="$cache/$name-image"
	rm -rf "$dir"
	mkdir -p "$dir/tmp"
	chmod 1777 "$dir/tmp"
	cp "$src" "$dir/$name"
	chmod 0755 "$dir/$name"
	for f in "$@"; do
		mkdir -p "$dir$(dirname "$f")"
		cp -L "$f" "$dir$f"
		chmod 0644 "$dir$f"
	done
	tar -C "$dir" --numeric-owner --owner=0 --group=0 -c . | docker import \
		--change "ENTRYPOINT [\"/$name\"]" \
		--change "USER $user" \
		--change "LABEL io.opensandbox.binary.sha256=$sum" \
		- "$image" >/dev/null
	rm -rf "$dir"
	# The replaced image would stay behind untagged; a container may still
	# use it, and then it stays.
	[[ -n $old ]] && docker image rm "$old" >/dev/null 2>&1 || true
	log "built $image from bin/$name"
}

# code_interpreter_image IMAGE ROOTFS makes IMAGE (opensandbox/code-interpreter):
# the root file system ROOTFS (opensandbox/code-interpreter:rootfs) plus the entrypoint script
# scripts/code-interpreter/code-interpreter.sh at the two paths clients name,
# /opt/code-interpreter/code-interpreter.sh and
# /opt/opensandbox/code-interpreter.sh. Its labels carry the script's SHA-256
# and the root file system's image id: it is remade, in about a second, when
# either changed.
code_interpreter_image() {
	local image=$1 base=$2
	local src=$top/scripts/code-interpreter/code-interpreter.sh sum base_id labels old dir cid
	sum=$(sha256sum "$src" | cut -d' ' -f1)
	base_id=$(docker image inspect --format '{{.Id}}' "$base")
	labels=$(docker image inspect --format '{{index .Config.Labels "io.opensandbox.entrypoint.sha256"}} {{index .Config.Labels "io.opensandbox.rootfs.id"}}' "$image" 2>/dev/null || true)
	if [[ ${FORCE:-0} != 1 && $labels == "$sum $base_id" ]]; then
		return
	fi
	old=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
	dir="$cache/code-interpreter-entrypoint"
	rm -rf "$dir"
	mkdir -p "$dir/opt/code-interpreter" "$dir/opt/opensandbox"
	install -m 0755 "$src" "$dir/opt/code-interpreter/code-interpreter.sh"
	install -m 0755 "$src" "$dir/opt/opensandbox/code-interpreter.sh"
	cid=$(docker create "$base")
	tar -C "$dir" --numeric-owner --owner=0 --group=0 -c opt | docker cp - "$cid:/"
	docker commit \
		--change "LABEL io.opensandbox.entrypoint.sha256=$sum io.opensandbox.rootfs.id=$base_id" \
		"$cid" "$image" >/dev/null
	docker rm "$cid" >/dev/null
	rm -rf "$dir"
	if [[ -n $old && $old != "$(docker image inspect --format '{{.Id}}' "$base")" ]]; then
		docker image rm "$old" >/dev/null 2>&1 || true
	fi
	log "built $image with scripts/code-interpreter/code-interpreter.sh"
}

main() {
	if ! docker version >/dev/null 2>&1; then
		log "no Docker engine answers; run scripts/docker-up.sh (make docker) first"
		exit 1
	fi
	ensure_tools
	mkdir -p "$cache"
	have_image opensandbox/base:bookworm || bootstrap opensandbox/base:bookworm "" base
	have_image opensandbox/python:3.11 || bootstrap opensandbox/python:3.11 "python3" python
	# The code interpreter's languages: python (with numpy, pandas,
	# matplotlib), javascript and typescript (nodejs, node-typescript),
	# java (JShell is in the JDK) and go.
	local code_pkgs="python3,python3-numpy,python3-pandas,python3-matplotlib,fonts-dejavu-core,nodejs,node-typescript,default-jdk-headless,golang-go"
	local code_sum old
	code_sum=$(printf '%s' "$code_pkgs" | sha256sum | cut -d' ' -f1)
	if ! have_image opensandbox/code-interpreter:rootfs ||
		[[ $(docker image inspect --format '{{index .Config.Labels "io.opensandbox.packages.sha256"}}' opensandbox/code-interpreter:rootfs) != "$code_sum" ]]; then
		old=$(docker image inspect --format '{{.Id}}' opensandbox/code-interpreter:rootfs 2>/dev/null || true)
		bootstrap opensandbox/code-interpreter:rootfs "" code "$code_pkgs" "io.opensandbox.packages.sha256=$code_sum"
		[[ -n $old ]] && docker image rm "$old" >/dev/null 2>&1 || true
	fi
	code_interpreter_image opensandbox/code-interpreter opensandbox/code-interpreter:rootfs
	if ! have_image opensandbox/busybox || ! have_image opensandbox/noshell; then
		busybox_images
	fi
	binary_image opensandbox/execd:latest execd 0
	binary_image opensandbox/server:latest opensandbox-server 65532:65532
	binary_image opensandbox/egress:latest osb-egress 0 /etc/ssl/certs/ca-certificates.crt
	binary_image opensandbox/ingress:latest osb-ingress 65532:65532 /etc/ssl/certs/ca-certificates.crt
	docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^opensandbox/' >&2
}

main "$@"
