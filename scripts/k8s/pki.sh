#!/usr/bin/env bash
# Make a throwaway PKI for the local cluster in .k8s/data/pki and the
# kubeconfigs that use it (certificates embedded): .k8s/data/admin.kubeconfig
# (copied to .k8s/kubeconfig once the cluster is up) and
# .k8s/data/kubelet.kubeconfig. Existing files are kept.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
LOG_PREFIX=k8s-pki

mkdir -p "$PKI"
cd "$PKI"

# has_sans CERT SANs: CERT names every one of the comma-separated SANs
# (openssl's spelling: DNS:x, IP:x).
has_sans() {
  local have want w
  have=$(openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null | tail -n +2 | sed 's/IP Address:/IP:/g; s/ //g')
  IFS=, read -ra want <<<"$2"
  for w in "${want[@]}"; do
    [[ ,$have, == *,"$w",* ]] || return 1
  done
}

# sign NAME CN [O] [SANs]: a key and a certificate signed by the CA; with
# SANs it is also a serving certificate. An existing certificate is kept
# unless it lacks one of the SANs.
sign() {
  local name=$1 cn=$2 o=${3:-} san=${4:-} subj
  if [[ -f $name.crt ]] && { [[ -z $san ]] || has_sans "$name.crt" "$san"; }; then
    return
  fi
  subj="/CN=$cn"
  [[ -n $o ]] && subj="/O=$o$subj"
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  if [[ -n $san ]]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$name.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$name.ext"
  fi
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -days 3650 -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

if [[ ! -f ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
    -subj /CN=opensandbox-k8s-ca 2>/dev/null
fi
sign apiserver kube-apiserver "" \
  "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP"
sign admin admin system:masters
sign apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
sign kubelet "system:node:$NODE_NAME" system:nodes
sign kubelet-serving "$NODE_NAME" "" "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
[[ -f sa.key ]] || openssl genrsa -out sa.key 2048 2>/dev/null
[[ -f sa.pub ]] || openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

# kubeconfig FILE USER: certificates embedded, so the file stands alone.
kubeconfig() {
  [[ -f $1 ]] && return
  cat >"$1.tmp" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: opensandbox-local
  cluster:
    server: $APISERVER
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$2.crt")
    client-key-data: $(base64 -w0 "$2.key")
contexts:
- name: opensandbox-local
  context: {cluster: opensandbox-local, user: $2}
current-context: opensandbox-local
EOK
  chmod 600 "$1.tmp"
  mv "$1.tmp" "$1"
}
kubeconfig "$DATA/admin.kubeconfig" admin
kubeconfig "$DATA/kubelet.kubeconfig" kubelet
