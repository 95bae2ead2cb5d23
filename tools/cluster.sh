#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, and its removal:
#
#   tools/cluster.sh up        start it (idempotent: returns at once if it is up)
#   tools/cluster.sh down      stop it and put the host back as it was; diffs the host
#                              (iptables, nftables, sysctls, mounts, links, cgroups, paths)
#                              against the snapshot taken by `up`; exits 1 if anything differs
#   tools/cluster.sh status    what runs
#   tools/cluster.sh restart-kubelet  stop and start the kubelet alone
#   tools/cluster.sh import TAR...   import image archives (docker-archive/OCI) into the node
#   tools/cluster.sh kubectl ARGS... kubectl against the cluster
#
# Parts: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
# (tools/build-control-plane.sh), containerd + runc + the CNI bridge, kubelet and kube-proxy
# (tools/build-node.sh), CoreDNS as a Deployment behind the kube-dns Service (cluster.local),
# a pause image built here from a few lines of C, rancher/local-path-provisioner behind the
# default StorageClass `local-path` (FORESIGHT_CLUSTER_STORAGE=local-pvs: pre-created local
# PVs instead), and the node advertising 4 nvidia.com/gpu (extended resource, no device
# plugin: pods that ask for GPUs schedule and run on the CPU).
#
# Everything lives under one state directory, FORESIGHT_CLUSTER_DIR (default
# ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster): certificates, logs, etcd, containerd,
# kubelet, CNI state, the volumes' directories. containerd, its shims and the kubelet run in a
# private mount namespace, so their mounts (overlay rootfs, tmpfs volumes, netns files) never
# appear in the host's mount table and vanish with them. Network: a bridge fsbr0 with
# 10.244.0.1/24 (pod subnet; the node IP and the API server's address), Services in
# 10.96.0.0/16 (kubernetes 10.96.0.1, kube-dns 10.96.0.10). The API server listens on
# https://10.244.0.1:6443 only; KUBECONFIG=$FORESIGHT_CLUSTER_DIR/admin.kubeconfig.
#
# Binaries: CONTROL_PLANE_BIN and NODE_BIN if set, else the output of the build scripts.
# Needs root. The fixes of shared/REAL-NODE.md are applied; see tools/README.md.
set -euo pipefail

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
S=${FORESIGHT_CLUSTER_DIR:-$cache/cluster}
NODE=foresight-node
BRIDGE=fsbr0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SVC_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10
API_PORT=6443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
GPUS=4
PVS=${FORESIGHT_CLUSTER_PVS:-8}
PAUSE_IMAGE=localhost/foresight-pause:1
LPP_IMAGE=localhost/foresight-local-path-provisioner:1
# Debian bookworm's busybox-static (1.35); the example's loader pod names busybox:1.37.
BUSYBOX_IMAGE=localhost/busybox:1.35
STORAGE=${FORESIGHT_CLUSTER_STORAGE:-local-path}
sock=$S/run/containerd.sock

[[ $(id -u) == 0 ]] || die "needs root"

# Paths outside the state directory that the components create no matter what they are
# told (hard-coded in kubelet, containerd and libcni: /var/lib/kubelet/device-plugins,
# /var/log/containers, /var/lib/cni, /run/containerd) or would create with a default left
# unset; `down` removes those that `up` found absent. /usr/libexec/kubernetes is not among them:
# the flex-volume directories are set for both the kubelet and the controller manager, so this
# cluster never creates it (another control plane without --flex-volume-plugin-dir, such as the
# tests' tools/control-plane.sh, does, and it is not ours to remove).
host_paths=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /var/lib/cni
  /opt/containerd /etc/cni /opt/cni /var/run/netns /etc/containerd /var/lib/containerd
  /etc/kubernetes /var/lib/kube-proxy /run/xtables.lock /etc/cdi /var/run/cdi /var/run/nri /opt/nri
  /etc/nri)
# Kernel settings the node may change: the kubelet (vm.overcommit_memory, kernel.panic,
# kernel.panic_on_oops, kernel.keys.*), the CNI bridge (ip_forward), kube-proxy
# (route_localnet, conntrack). `down` writes back every one that differs.
sysctl_keys=(net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding
  vm.overcommit_memory kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait
  net.ipv4.vs.conntrack net.ipv4.conf.all.arp_ignore net.ipv4.conf.all.arp_announce)

# --- host snapshots -------------------------------------------------------------------------
snapshot() { # dir
  local d=$1
  mkdir -p "$d"
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$d/iptables" || true
  ip6tables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$d/ip6tables" || true
  if command -v nft >/dev/null; then nft list tables >"$d/nft-tables" 2>/dev/null || true; fi
  if command -v iptables-legacy-save >/dev/null; then
    { iptables-legacy-save; ip6tables-legacy-save; } 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$d/iptables-legacy" || true
  fi
  # Volatile counters and per-interface keys of links that come and go are left out.
  sysctl -a 2>/dev/null | grep -vE '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|quota)|kernel\.(random|ns_last_pid|sched_domain)|net\.netfilter\.nf_conntrack_count|net\.(ipv4|ipv6)\.(conf|neigh)\.(veth|'"$BRIDGE"')|kernel\.pty\.nr)' |
    sort >"$d/sysctl"
  awk '{ print $5, $9, $10 }' /proc/self/mountinfo | sort >"$d/mounts"
  ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | sort >"$d/links"
  ip -o addr show | awk '{ print $2, $3, $4 }' | sort >"$d/addrs"
  ip route show table all 2>/dev/null | grep -v '^local\|^broadcast\|cache' | sort >"$d/routes" || true
  find /sys/fs/cgroup -mindepth 1 -maxdepth 3 -type d 2>/dev/null | sort >"$d/cgroups"
  local p
  for p in "${host_paths[@]}"; do if [[ -e $p ]]; then echo "$p"; fi; done >"$d/paths"
}

# --- processes ------------------------------------------------------------------------------
start() { # name command... : in the background, its own session, pid in $S/pids/name
  local name=$1
  shift
  setsid "$@" </dev/null >"$S/logs/$name.log" 2>&1 &
  echo $! >"$S/pids/$name"
}
in_ns() { nsenter --mount="/proc/$(cat "$S/pids/mntns")/ns/mnt" -- "$@"; }
ns_enter() { echo nsenter --mount="/proc/$(cat "$S/pids/mntns")/ns/mnt" --; }
alive() { [[ -f $S/pids/$1 ]] && kill -0 "$(cat "$S/pids/$1")" 2>/dev/null; }
stop() { # name [signal wait_s]
  local name=$1 pid i
  [[ -f $S/pids/$name ]] || return 0
  pid=$(cat "$S/pids/$name")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < ${2:-100}; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$S/pids/$name"
}
wait_for() { # what timeout_s name command...
  local what=$1 timeout=$2 name=$3 t0=$SECONDS
  shift 3
  until "$@" >/dev/null 2>&1; do
    if [[ $name != - ]] && ! alive "$name"; then
      tail -n 30 "$S/logs/$name.log" >&2
      die "$name exited"
    fi
    ((SECONDS - t0 < timeout)) || { [[ $name == - ]] || tail -n 30 "$S/logs/$name.log" >&2; die "$what not ready after ${timeout}s"; }
    sleep 0.3
  done
}
k() { "$CP_BIN/kubectl" --kubeconfig "$S/admin.kubeconfig" "$@"; }
ctr_() { "$NODE_BIN/ctr" --address "$sock" "$@"; }

binaries() {
  CP_BIN=${CONTROL_PLANE_BIN:-$("$tools_dir/build-control-plane.sh" | tail -n1)}
  NODE_BIN=${NODE_BIN:-$("$tools_dir/build-node.sh" | tail -n1)}
  [[ -x $CP_BIN/kube-apiserver && -x $NODE_BIN/kubelet ]] || die "binaries missing in $CP_BIN or $NODE_BIN"
}

# --- node images (pause, coredns) -----------------------------------------------------------
bah() { # buildah with its storage, run state and CNI directory under the cache (as build-images.sh)
  mkdir -p "$cache/images/cni"
  [[ -f $cache/images/containers.conf ]] ||
    printf '[network]\nnetwork_config_dir = "%s"\n' "$cache/images/cni" >"$cache/images/containers.conf"
  CONTAINERS_CONF=$cache/images/containers.conf buildah --root "$cache/images/storage/root" --runroot "$cache/images/storage/run" --storage-driver overlay "$@"
}
coredns_version() { "$NODE_BIN/coredns" -version | awk -F- '/CoreDNS/ { print $2; exit }'; }
node_images() { # builds the pause and coredns archives if missing; prints their paths
  local dir=$cache/images/archives c
  mkdir -p "$dir" "$cache/images/node"
  if [[ ! -f $dir/pause.tar ]]; then
    # The sandbox's process: sleeps until TERM/INT and reaps nothing (pods do not share PIDs).
    cat >"$cache/images/node/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
int main(void) {
  signal(SIGTERM, quit);
  signal(SIGINT, quit);
  for (;;) pause();
}
EOF
    gcc -Os -static -s -o "$cache/images/node/pause" "$cache/images/node/pause.c"
    c=$(bah from --quiet scratch)
    bah copy --quiet "$c" "$cache/images/node/pause" /pause
    bah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    bah commit --quiet --rm "$c" "$PAUSE_IMAGE" >/dev/null
    bah push --quiet "$PAUSE_IMAGE" "docker-archive:$dir/pause.tar:$PAUSE_IMAGE"
    log "pause image: $(stat -c %s "$cache/images/node/pause") bytes binary"
  fi
  local coredns_v
  coredns_v=$(coredns_version)
  COREDNS_IMAGE=localhost/foresight-coredns:$coredns_v
  if [[ ! -f $dir/coredns-$coredns_v.tar ]]; then
    c=$(bah from --quiet scratch)
    bah copy --quiet "$c" "$NODE_BIN/coredns" /coredns
    bah config --entrypoint '["/coredns"]' --cmd '-conf /etc/coredns/Corefile' --user 10001:10001 "$c"
    bah commit --quiet --rm "$c" "$COREDNS_IMAGE" >/dev/null
    bah push --quiet "$COREDNS_IMAGE" "docker-archive:$dir/coredns-$coredns_v.tar:$COREDNS_IMAGE"
  fi
  # local-path-provisioner (static binary on scratch) and its helper image: busybox from
  # Debian's busybox-static, whose `sh`, `mkdir` and `rm` the provisioner's setup and teardown
  # scripts run (it also has `tar`, which `kubectl cp` needs).
  if [[ ! -f $dir/local-path-provisioner.tar ]]; then
    c=$(bah from --quiet scratch)
    bah copy --quiet "$c" "$NODE_BIN/local-path-provisioner" /local-path-provisioner
    bah config --entrypoint '["/local-path-provisioner"]' --user 10001:10001 "$c"
    bah commit --quiet --rm "$c" "$LPP_IMAGE" >/dev/null
    bah push --quiet "$LPP_IMAGE" "docker-archive:$dir/local-path-provisioner.tar:$LPP_IMAGE"
  fi
  if [[ ! -f $dir/busybox.tar ]]; then
    local rootfs=$cache/images/node/busybox-rootfs
    rm -rf "$rootfs"
    mmdebstrap --quiet --variant=extract --include=busybox-static bookworm "$rootfs" >&2
    rm -rf "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/var/cache/apt "$rootfs"/var/lib/apt "$rootfs"/dev/*
    chroot "$rootfs" /bin/busybox --install -s /bin
    install -d -m 1777 "$rootfs/tmp"
    c=$(bah from --quiet scratch)
    bah add --quiet "$c" "$rootfs" / >/dev/null
    bah config --cmd '["sh"]' "$c"
    bah commit --quiet --rm "$c" "$BUSYBOX_IMAGE" >/dev/null
    bah push --quiet "$BUSYBOX_IMAGE" "docker-archive:$dir/busybox.tar:$BUSYBOX_IMAGE"
    rm -rf "$rootfs"
  fi
  # containers/storage leaves its overlay directory bind-mounted onto itself.
  if mountpoint -q "$cache/images/storage/root/overlay"; then umount "$cache/images/storage/root/overlay"; fi
  echo "$dir/pause.tar" "$dir/coredns-$coredns_v.tar" "$dir/local-path-provisioner.tar" "$dir/busybox.tar"
}

# --- certificates and kubeconfigs -----------------------------------------------------------
pki() {
  local d=$S/pki
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=foresight-cluster-ca" -keyout ca.key -out ca.crt
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr
    printf '%s\n' 'basicConstraints = CA:FALSE' 'keyUsage = digitalSignature, keyEncipherment' \
      'extendedKeyUsage = serverAuth' \
      "subjectAltName = IP:$NODE_IP, IP:127.0.0.1, IP:10.96.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local" \
      >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile apiserver.ext -out apiserver.crt
    # The API server's client certificate for the kubelet (logs, exec, port-forward).
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -keyout kubelet-client.key -out kubelet-client.csr
    printf '%s\n' 'basicConstraints = CA:FALSE' 'keyUsage = digitalSignature, keyEncipherment' 'extendedKeyUsage = clientAuth' >client.ext
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile client.ext -out kubelet-client.crt
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) >"$S/logs/openssl.log" 2>&1 || { cat "$S/logs/openssl.log" >&2; die openssl; }
  local t_admin t_kcm t_sched t_kubelet t_proxy
  t_admin=$(openssl rand -hex 16) t_kcm=$(openssl rand -hex 16) t_sched=$(openssl rand -hex 16)
  t_kubelet=$(openssl rand -hex 16) t_proxy=$(openssl rand -hex 16)
  cat >"$d/tokens.csv" <<EOF
$t_admin,admin,admin,"system:masters"
$t_kcm,system:kube-controller-manager,kcm
$t_sched,system:kube-scheduler,scheduler
$t_kubelet,system:node:$NODE,kubelet,"system:nodes"
$t_proxy,system:kube-proxy,kube-proxy
EOF
  chmod 600 "$d/tokens.csv" "$d"/*.key
  local f t
  for f in admin:$t_admin kcm:$t_kcm scheduler:$t_sched kubelet:$t_kubelet kube-proxy:$t_proxy; do
    t=${f#*:}
    cat >"$S/${f%%:*}.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: foresight
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $d/ca.crt
users:
- name: user
  user:
    token: $t
contexts:
- name: foresight
  context: {cluster: foresight, user: user, namespace: default}
current-context: foresight
EOF
    chmod 600 "$S/${f%%:*}.kubeconfig"
  done
}

start_kubelet() {
  start kubelet $(ns_enter) "$NODE_BIN/kubelet" --config "$S/kubelet.yaml" --kubeconfig "$S/kubelet.kubeconfig" \
    --root-dir "$S/kubelet" --cert-dir "$S/kubelet/pki" --hostname-override "$NODE" --node-ip "$NODE_IP"
}

# rancher/local-path-provisioner: one directory per claim under $S/local-path, made and
# removed by helper pods. Configured as a shared filesystem (one node): no node affinity, any
# access mode (the MNIST claim is ReadWriteMany), Immediate binding.
local_path_provisioner() {
  mkdir -p "$S/local-path"
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: local-path-storage}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: local-path-provisioner-service-account, namespace: local-path-storage}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: local-path-provisioner, namespace: local-path-storage}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: local-path-provisioner, namespace: local-path-storage}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: local-path-provisioner}
subjects: [{kind: ServiceAccount, name: local-path-provisioner-service-account, namespace: local-path-storage}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: local-path-provisioner}
rules:
- apiGroups: [""]
  resources: [nodes, persistentvolumeclaims, configmaps, pods, pods/log]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: local-path-provisioner}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: local-path-provisioner}
subjects: [{kind: ServiceAccount, name: local-path-provisioner-service-account, namespace: local-path-storage}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-path-config, namespace: local-path-storage}
data:
  config.json: '{"sharedFileSystemPath": "$S/local-path"}'
  setup: |-
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    set -eu
    rm -rf "\$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata:
      name: helper-pod
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: helper-pod
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: local-path-provisioner, namespace: local-path-storage}
spec:
  selector: {matchLabels: {app: local-path-provisioner}}
  template:
    metadata: {labels: {app: local-path-provisioner}}
    spec:
      # The helper pods run under this account too (the provisioner's default name for it).
      serviceAccountName: local-path-provisioner-service-account
      securityContext: {runAsNonRoot: true, runAsUser: 10001}
      containers:
      - name: local-path-provisioner
        image: $LPP_IMAGE
        imagePullPolicy: Never
        args: [start, --config, /etc/config/config.json, --helper-image, $BUSYBOX_IMAGE]
        env:
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - {name: CONFIG_MOUNT_PATH, value: /etc/config/}
        volumeMounts: [{name: config, mountPath: /etc/config/}]
      volumes: [{name: config, configMap: {name: local-path-config}}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-path
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: rancher.io/local-path
volumeBindingMode: Immediate
reclaimPolicy: Delete
EOF
}

# --- up -------------------------------------------------------------------------------------
up() {
  if alive kube-apiserver && alive kubelet; then
    log "already up: KUBECONFIG=$S/admin.kubeconfig"
    return 0
  fi
  [[ ! -e $S/host-before ]] || die "$S holds a cluster that is not fully up: run '$0 down' first"
  binaries
  local t0=$SECONDS
  mkdir -p "$S"/{logs,pids,run,etcd,cni/net.d,cni/networks,kubelet,pod-logs,pv,volume-plugins,cdi}
  snapshot "$S/host-before"
  trap 'rc=$?; if ((rc)); then log "up failed: taking the cluster down (logs kept: KEEP_CLUSTER_DIR=1)"; KEEP_CLUSTER_DIR=1 down_ || true; fi' EXIT
  local pause_tar coredns_tar lpp_tar busybox_tar
  read -r pause_tar coredns_tar lpp_tar busybox_tar < <(node_images)
  COREDNS_IMAGE=localhost/foresight-coredns:$(coredns_version)

  # The bridge first: the node IP, the API server's address and the pods' gateway.
  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  pki

  start etcd "$CP_BIN/etcd" --name foresight --data-dir "$S/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "foresight=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
  wait_for etcd 60 etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  # Advertised on the bridge (not loopback), so the endpoint reconciler keeps the
  # `kubernetes` Service pointing at it and pods reach the API server through it.
  start kube-apiserver "$CP_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --cert-dir "$S/pki/apiserver-certs" \
    --tls-cert-file "$S/pki/apiserver.crt" --tls-private-key-file "$S/pki/apiserver.key" \
    --client-ca-file "$S/pki/ca.crt" --token-auth-file "$S/pki/tokens.csv" \
    --kubelet-client-certificate "$S/pki/kubelet-client.crt" --kubelet-client-key "$S/pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$S/pki/sa.pub" --service-account-signing-key-file "$S/pki/sa.key" \
    --service-cluster-ip-range "$SVC_CIDR" --allow-privileged=true
  wait_for kube-apiserver 120 kube-apiserver k get --raw /readyz

  # The controller manager's RBAC bootstrap can race the API server's (REAL-NODE.md #7): the
  # wait below restarts it once if it exits.
  local kcm_args=(--kubeconfig "$S/kcm.kubeconfig" --authentication-kubeconfig "$S/kcm.kubeconfig"
    --authorization-kubeconfig "$S/kcm.kubeconfig" --bind-address 127.0.0.1 --cert-dir "$S/pki/kcm-certs"
    --service-account-private-key-file "$S/pki/sa.key" --root-ca-file "$S/pki/ca.crt"
    --use-service-account-credentials --service-cluster-ip-range "$SVC_CIDR"
    --flex-volume-plugin-dir "$S/volume-plugins" --leader-elect=false)
  start kube-controller-manager "$CP_BIN/kube-controller-manager" "${kcm_args[@]}"
  start kube-scheduler "$CP_BIN/kube-scheduler" --kubeconfig "$S/scheduler.kubeconfig" \
    --authentication-kubeconfig "$S/scheduler.kubeconfig" --authorization-kubeconfig "$S/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
  local i
  for ((i = 0; i < 200; i++)); do
    curl -fsSk https://127.0.0.1:10257/healthz >/dev/null 2>&1 && break
    if ! alive kube-controller-manager; then
      ((i < 100)) || die "kube-controller-manager exited twice"
      log "kube-controller-manager exited: restarting it once"
      tail -n 5 "$S/logs/kube-controller-manager.log" >&2
      start kube-controller-manager "$CP_BIN/kube-controller-manager" "${kcm_args[@]}"
      i=100
    fi
    sleep 0.3
  done
  curl -fsSk https://127.0.0.1:10257/healthz >/dev/null 2>&1 || die "kube-controller-manager not healthy"
  wait_for kube-scheduler 60 kube-scheduler curl -fsSk https://127.0.0.1:10259/healthz

  # --- the node's runtime, in a private mount namespace ---
  start mntns unshare --mount --propagation private sleep infinity
  sleep 0.2
  in_ns sh -c "mount --bind '$S' '$S' && mount --make-rshared '$S'"
  cat >"$S/containerd.toml" <<EOF
version = 4
root = '$S/containerd/root'
state = '$S/containerd/state'
[plugins.'io.containerd.server.v1.grpc']
  address = '$sock'
[plugins.'io.containerd.server.v1.ttrpc']
  address = '$sock.ttrpc'
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '$PAUSE_IMAGE'
[plugins.'io.containerd.cri.v1.runtime']
  # The guest's capability set lacks CAP_SYS_RESOURCE: writing oom_score_adj fails (REAL-NODE.md #1).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ['$S/cdi']
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = '$(command -v runc)'
  Root = '$S/run/runc'
  SystemdCgroup = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '$S/cni/net.d'
[plugins.'io.containerd.internal.v1.opt']
  path = '$S/containerd/opt'
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.image-verifier.v1.bindir']
  bin_dir = '$S/containerd/image-verifier'
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = '$S/run/s'
EOF
  cat >"$S/cni/net.d/10-foresight.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "foresight",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$S/cni/networks",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  start containerd $(ns_enter) "$NODE_BIN/containerd" --config "$S/containerd.toml"
  wait_for containerd 60 containerd ctr_ version
  # The node's own images (pause: the sandbox; coredns), imported like any other.
  ctr_ -n k8s.io images import --local --discard-unpacked-layers "$pause_tar" >"$S/logs/import.log" 2>&1
  local tar
  for tar in "$coredns_tar" "$lpp_tar" "$busybox_tar"; do ctr_ -n k8s.io images import --local --discard-unpacked-layers "$tar" >>"$S/logs/import.log" 2>&1; done

  cat >"$S/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $S/pki/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$sock
cgroupDriver: cgroupfs
# cgroup v1 host (REAL-NODE.md #2); oom_score_adj cannot be written (#1).
failCgroupV1: false
oomScoreAdj: 0
failSwapOn: false
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: $S/pod-logs
volumePluginDir: $S/volume-plugins
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
# Absolute disk thresholds: this node shares a developer's or CI's disk, where 2 % of 250 GB
# (5 GB) evicted the e2e's pods with 3.9 GB still free; its pods write megabytes.
evictionHard: {memory.available: 200Mi, nodefs.available: 512Mi, imagefs.available: 512Mi}
maxPods: 110
EOF
  start_kubelet
  wait_for "node $NODE Ready" 90 kubelet sh -c "'$CP_BIN/kubectl' --kubeconfig '$S/admin.kubeconfig' get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

  cat >"$S/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $S/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
# Pod -> Service -> pod on the same bridge without br_netfilter: masquerade, so replies come back
# through the host.
iptables: {masqueradeAll: true, localhostNodePorts: false}
# 0: leave the host's conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$NODE_BIN/kube-proxy" --config "$S/kube-proxy.yaml"
  wait_for kube-proxy 60 kube-proxy curl -fsS http://127.0.0.1:10256/healthz

  # GPUs as an extended resource (no device plugin): the kubelet keeps capacity it does not
  # manage across its status updates.
  k patch node "$NODE" --subresource=status --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$GPUS\"},
         {\"op\": \"add\", \"path\": \"/status/allocatable/nvidia.com~1gpu\", \"value\": \"$GPUS\"}]" >/dev/null

  if [[ $STORAGE == local-pvs ]]; then
  # Storage: pre-created local PersistentVolumes (kubernetes.io/no-provisioner) and a default
  # StorageClass. Each PV is a directory under the state directory, any access mode, so
  # ReadWriteMany claims (the MNIST data) bind too; Retain, since nothing deletes local PVs.
  {
    cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
reclaimPolicy: Retain
EOF
    for ((i = 1; i <= PVS; i++)); do
      install -d -m 0777 "$S/pv/pv-$i"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: local-pv-$i
spec:
  capacity: {storage: 20Gi}
  accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: $S/pv/pv-$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
EOF
    done
  } | k apply -f - >/dev/null
  else
    local_path_provisioner
  fi

  # CoreDNS behind kube-dns, serving cluster.local from the API server.
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      priorityClassName: system-cluster-critical
      securityContext: {runAsNonRoot: true, runAsUser: 10001}
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}}
        resources: {requests: {cpu: 50m, memory: 40Mi}, limits: {memory: 170Mi}}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
  k -n kube-system rollout status deploy/coredns --timeout=120s >&2
  [[ $STORAGE == local-pvs ]] || k -n local-path-storage rollout status deploy/local-path-provisioner --timeout=120s >&2
  trap - EXIT
  log "up in $((SECONDS - t0))s: export KUBECONFIG=$S/admin.kubeconfig"
}

# --- down -----------------------------------------------------------------------------------
kill_cgroup_tasks() { # every process in a kubepods cgroup (the pods' containers)
  local f pid
  for f in $(find /sys/fs/cgroup -path '*kubepods*' -name cgroup.procs 2>/dev/null); do
    { while read -r pid; do kill -9 "$pid" 2>/dev/null; done <"$f"; } 2>/dev/null
  done
}
down_() {
  # Best effort, step by step: one failing step must not leave the rest undone.
  set +e
  local t0=$SECONDS
  [[ -d $S ]] || { log "nothing to take down ($S does not exist)"; return 0; }
  CP_BIN=${CONTROL_PLANE_BIN:-${CP_BIN:-}}
  NODE_BIN=${NODE_BIN:-}
  if [[ -z $NODE_BIN ]]; then NODE_BIN=$("$tools_dir/build-node.sh" --no-apt 2>/dev/null | tail -n1) || true; fi
  stop kube-proxy 50
  [[ -x $NODE_BIN/kube-proxy ]] && "$NODE_BIN/kube-proxy" --cleanup >"$S/logs/kube-proxy-cleanup.log" 2>&1 || true
  stop kubelet 100
  # The pods' containers: killed, then their shims and containerd; the private mount
  # namespace dies with its last process, and the pods' network namespaces with it.
  if alive containerd; then
    local id
    for id in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null); do ctr_ -n k8s.io tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  fi
  kill_cgroup_tasks
  stop containerd 100
  local pid
  for pid in $(pgrep -f -- "-address $sock" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  kill_cgroup_tasks
  stop mntns 10
  # The control plane together: TERM to all four, then wait for each.
  local n
  for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [[ -f $S/pids/$n ]] && kill "$(cat "$S/pids/$n")" 2>/dev/null
  done
  for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$n" 100; done
  ip link del "$BRIDGE" 2>/dev/null || true
  # Leftover veths of pods whose namespaces are gone are removed with them; any still here is ours.
  local l
  for l in $(ip -o link show type veth 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//'); do
    ip link show "$l" 2>/dev/null | grep -q "master $BRIDGE" && ip link del "$l" || true
  done
  conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true
  conntrack -D -d "$POD_CIDR" >/dev/null 2>&1 || true

  local b=$S/host-before
  if [[ -d $b ]]; then
    # Firewall: tables that were not there are deleted, the others restored as they were.
    if command -v nft >/dev/null; then
      local fam name
      while read -r _ fam name; do
        grep -qx "table $fam $name" "$b/nft-tables" 2>/dev/null || nft delete table "$fam" "$name" 2>/dev/null || true
      done < <(nft list tables 2>/dev/null)
    fi
    [[ -s $b/iptables ]] && iptables-restore <"$b/iptables" || true
    [[ -s $b/ip6tables ]] && ip6tables-restore <"$b/ip6tables" || true
    # Kernel settings.
    local key val now
    for key in "${sysctl_keys[@]}"; do
      val=$(awk -F' = ' -v k="$key" '$1 == k { print $2 }' "$b/sysctl")
      [[ -n $val ]] || continue
      now=$(sysctl -n "$key" 2>/dev/null) || continue
      [[ $now == "$val" ]] || sysctl -qw "$key=$val" || log "could not restore $key=$val (now $now)"
    done
    # cgroups the kubelet and containerd made (kubepods and below), deepest first.
    find /sys/fs/cgroup -mindepth 2 -depth -type d -path '*kubepods*' -exec rmdir {} + 2>/dev/null || true
    local g
    comm -13 "$b/cgroups" <(find /sys/fs/cgroup -mindepth 1 -maxdepth 3 -type d 2>/dev/null | sort) |
      sort -r | while read -r g; do find "$g" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
    # Paths outside the state directory that were not there before.
    local p
    for p in "${host_paths[@]}"; do
      [[ -e $p ]] && ! grep -qx "$p" "$b/paths" && rm -rf "$p"
    done
    snapshot "$S/host-after"
    local diffs=0 f
    for f in iptables ip6tables iptables-legacy nft-tables sysctl mounts links addrs routes cgroups paths; do
      [[ -f $b/$f ]] || continue
      if ! diff -u "$b/$f" "$S/host-after/$f" >"$S/host-after/$f.diff"; then
        diffs=1
        log "host differs after down: $f"
        cat "$S/host-after/$f.diff" >&2
      fi
    done
    if ((diffs)); then
      log "state kept in $S for inspection"
      return 1
    fi
    log "host restored: iptables, ip6tables, nftables, sysctls, mounts, links, addresses, routes, cgroups and paths as before"
  fi
  if [[ ${KEEP_CLUSTER_DIR:-0} == 1 ]]; then
    mv "$S" "$S.last-$(date +%s)"
  else
    rm -rf "$S"
  fi
  log "down in $((SECONDS - t0))s"
}

status() {
  local n
  for n in etcd kube-apiserver kube-controller-manager kube-scheduler mntns containerd kubelet kube-proxy; do
    if alive "$n"; then echo "$n running (pid $(cat "$S/pids/$n"))"; else echo "$n not running"; fi
  done
}

cmd=${1:-}
shift || true
case $cmd in
  up) up ;;
  down) down_ ;;
  status) status ;;
  restart-kubelet) # the kubelet alone, e.g. to check what survives its restart
    binaries
    alive kubelet || die "the kubelet is not running"
    stop kubelet 100
    start_kubelet
    wait_for "kubelet healthz" 60 kubelet curl -fsS http://127.0.0.1:10248/healthz ;;
  import)
    NODE_BIN=${NODE_BIN:-$("$tools_dir/build-node.sh" --no-apt | tail -n1)}
    # Unpacked, an image's layers are not needed again (the archive stays in the image cache):
    # without them the worker image takes 4.4 GB on the node rather than 8.7.
    for tar in "$@"; do ctr_ -n k8s.io images import --local --discard-unpacked-layers "$tar" >&2; done ;;
  kubectl)
    CP_BIN=${CONTROL_PLANE_BIN:-$("$tools_dir/build-control-plane.sh" | tail -n1)}
    k "$@" ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
