#!/bin/bash
# code-interpreter.sh is the entrypoint of the opensandbox/code-interpreter
# image, installed at /opt/code-interpreter/code-interpreter.sh and at
# /opt/opensandbox/code-interpreter.sh, the two paths clients name.
#
# It honours the environment the image documents for language versions:
#
#   PYTHON_VERSION   e.g. 3.11
#   NODE_VERSION     e.g. 18
#   JAVA_VERSION     e.g. 17
#   GO_VERSION       e.g. 1.19
#
# The image holds one version of each language it has. A variable that is
# unset or empty, or that names the installed version (a prefix of it on a
# component boundary: 3.11 matches 3.11.2), is accepted; any other request,
# or one for a language the image does not have, is printed as an error and
# the script exits with status 2. Otherwise it stays alive as the
# sandbox's main process (execd serves the code interpreter itself) and
# exits promptly on SIGTERM.
set -u

# installed LANGUAGE prints the version of LANGUAGE in this image, or
# nothing when the image has none.
installed() {
	case $1 in
	python) command -v python3 >/dev/null && python3 -c 'import platform; print(platform.python_version())' ;;
	node) command -v node >/dev/null && node --version | sed 's/^v//' ;;
	java)
		# "openjdk version "17.0.9" 2023-10-17" on the first line.
		command -v java >/dev/null && java -version 2>&1 | sed -n '1s/^[^"]*"\([^"]*\)".*/\1/p'
		;;
	go) command -v go >/dev/null && go env GOVERSION | sed 's/^go//' ;;
	esac
}

# matches WANTED HAVE: WANTED is HAVE, or HAVE begins with WANTED and a dot
# (a leading "v" or "go" on WANTED is ignored).
matches() {
	local want=${1#v}
	want=${want#go}
	[[ $2 == "$want" || $2 == "$want".* ]]
}

failed=0
check() {
	local var=$1 lang=$2 label=$3 want have
	want=${!var:-}
	[[ -n $want ]] || return 0
	have=$(installed "$lang" 2>/dev/null)
	if [[ -z $have ]]; then
		echo "code-interpreter: $var=$want asks for $label, which this image does not have" >&2
		failed=1
	elif ! matches "$want" "$have"; then
		echo "code-interpreter: $var=$want asks for $label $want, but this image has $label $have only: leave $var unset or set it to $have" >&2
		failed=1
	fi
}

check PYTHON_VERSION python Python
check NODE_VERSION node Node.js
check JAVA_VERSION java Java
check GO_VERSION go Go
if ((failed)); then
	exit 2
fi
echo "code-interpreter: ready"

trap 'kill $! 2>/dev/null; exit 0' TERM INT
sleep infinity &
wait
