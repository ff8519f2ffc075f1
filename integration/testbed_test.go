package integration

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A testbed is a set of test hosts on one machine: each a network namespace
// with its own address on a shared bridge, so nodes talk over real links
// (ARP, a bridge, a qdisc) rather than one loopback address. The test
// process sits on the bridge too, at gw, as the hosts' loaders and operator.
type testbed struct {
	t      *testing.T
	prefix string // of every name it creates, unique to this test process
	bridge string
	gw     string
	hosts  []*testHost
	// forwardRule is the iptables rule letting bridged packets between hosts
	// through, when bridge netfilter would hand them to iptables.
	forwardRule []string
}

// acceptBridged lets the hosts talk to each other. With br_netfilter loaded
// and the global bridge-nf-call-iptables on (Docker does both, and sets the
// FORWARD policy to DROP), packets crossing any bridge go through iptables'
// FORWARD chain; the bridge's own nf_call_iptables 0 cannot override the
// global switch, so one ACCEPT rule for this bridge goes first.
func (tb *testbed) acceptBridged() {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		return
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		tb.t.Fatalf("testbed: bridge netfilter is on but there is no iptables to let the hosts' traffic through: %v", err)
	}
	tb.forwardRule = []string{"FORWARD", "-i", tb.bridge, "-o", tb.bridge, "-j", "ACCEPT"}
	tb.must(append([]string{"iptables", "-I"}, tb.forwardRule...)...)
}

// A testHost is one namespace. Its egress to other hosts goes through an htb
// class limited to the testbed's rate (class 1:20, whose byte counter is the
// host's cross-host traffic); traffic to the test process (loaders, the
// operator) has its own unlimited class 1:10, as a loader on the host would
// talk to its node over loopback.
type testHost struct {
	tb    *testbed
	ns    string
	ip    string
	outer string // the veth end on the bridge: down is a cut cable
}

// The testbed's subnet: private, and only ever inside namespaces it creates.
const testbedNet = "10.213"

// newTestbed creates n hosts whose links to each other are limited to rate
// (tc syntax, e.g. 10gbit). Everything is removed when the test ends; `make
// test-hosts` also runs scripts/hosts-clean.sh in case a test process died
// before its cleanup could run.
func newTestbed(t *testing.T, n int, rate string) *testbed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("NOT RUN: the multi-host testbed needs root (network namespaces, veth, a bridge, tc)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("NOT RUN: the multi-host testbed needs iproute2's %s: %v", tool, err)
		}
	}
	if n > 240 {
		t.Fatalf("testbed: %d hosts, at most 240", n)
	}
	tb := &testbed{t: t, prefix: fmt.Sprintf("sfh%x", os.Getpid()&0xfffff), gw: testbedNet + ".0.1"}
	tb.bridge = tb.prefix + "br"
	t.Cleanup(tb.remove)
	tb.must("ip", "link", "add", tb.bridge, "type", "bridge",
		// Docker turns on bridge netfilter with FORWARD dropping: keep the
		// testbed's bridged traffic out of iptables.
		"nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0")
	tb.acceptBridged()
	tb.must("ip", "addr", "add", tb.gw+"/16", "dev", tb.bridge)
	tb.must("ip", "link", "set", tb.bridge, "up")
	for i := 1; i <= n; i++ {
		h := &testHost{tb: tb, ns: fmt.Sprintf("%s-h%d", tb.prefix, i), ip: fmt.Sprintf("%s.0.%d", testbedNet, 10+i),
			outer: fmt.Sprintf("%sh%d", tb.prefix, i)}
		tb.hosts = append(tb.hosts, h)
		tb.must("ip", "netns", "add", h.ns)
		tb.must("ip", "link", "add", h.outer, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
		tb.must("ip", "link", "set", h.outer, "master", tb.bridge, "up")
		tb.must("ip", "-n", h.ns, "addr", "add", h.ip+"/16", "dev", "eth0")
		tb.must("ip", "-n", h.ns, "link", "set", "eth0", "up")
		tb.must("ip", "-n", h.ns, "link", "set", "lo", "up")
		tb.must("tc", "-n", h.ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20")
		tb.must("tc", "-n", h.ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit")
		tb.must("tc", "-n", h.ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", rate, "ceil", rate)
		tb.must("tc", "-n", h.ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
			"match", "ip", "dst", tb.gw+"/32", "flowid", "1:10")
	}
	tb.staticNeighbours()
	return tb
}

// staticNeighbours gives every host a permanent ARP entry for every other
// host and the gateway. The kernel keeps one neighbour table for all
// namespaces, and its garbage-collected entries are capped machine-wide
// (gc_thresh3, 1024 by default): 32 hosts that all talk need ~1,056. Past
// the cap, ARP entries are not created and packets to the hosts last in
// line fail (ENOBUFS): SYNs never leave, and gossip probes go unanswered.
// That is one machine standing in for 32, not a network's behaviour (each
// real host has a table of its own), and it cost the 32-host epoch ~100
// storage reads per run before this. Permanent entries are outside the cap.
func (tb *testbed) staticNeighbours() {
	mac := func(argv ...string) string {
		out := tb.output(argv...)
		m := linkAddress.FindSubmatch(out)
		if m == nil {
			tb.t.Fatalf("testbed: no link address in %s:\n%s", strings.Join(argv, " "), out)
		}
		return string(m[1])
	}
	ips, macs := []string{tb.gw}, []string{mac("ip", "link", "show", tb.bridge)}
	for _, h := range tb.hosts {
		ips, macs = append(ips, h.ip), append(macs, mac("ip", "-n", h.ns, "link", "show", "eth0"))
	}
	for _, h := range tb.hosts {
		var batch strings.Builder
		for i, ip := range ips {
			if ip != h.ip {
				fmt.Fprintf(&batch, "neigh replace %s lladdr %s dev eth0 nud permanent\n", ip, macs[i])
			}
		}
		cmd := exec.Command("ip", "-n", h.ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.t.Fatalf("testbed: ARP entries in %s: %v\n%s", h.ns, err, out)
		}
	}
}

var linkAddress = regexp.MustCompile(`link/ether ([0-9a-f:]{17})`)

func (tb *testbed) must(argv ...string) {
	tb.t.Helper()
	tb.output(argv...)
}

// output runs a command and returns what it printed, failing the test when
// it fails.
func (tb *testbed) output(argv ...string) []byte {
	tb.t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		tb.t.Fatalf("testbed: %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return out
}

// remove kills whatever still runs in the hosts and deletes the namespaces
// (their veths go with them) and the bridge.
func (tb *testbed) remove() {
	for _, h := range tb.hosts {
		if out, err := exec.Command("ip", "netns", "pids", h.ns).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					if p, err := os.FindProcess(pid); err == nil {
						p.Kill()
					}
				}
			}
		}
		// Deleting the outer end takes the pair down at once; a namespace's
		// own teardown runs later in the kernel, and a veth it still held
		// made the next testbed's "ip link add" fail with "File exists".
		exec.Command("ip", "link", "del", h.outer).Run() // already gone is fine
		if out, err := exec.Command("ip", "netns", "del", h.ns).CombinedOutput(); err != nil {
			tb.t.Errorf("testbed cleanup: ip netns del %s: %v\n%s", h.ns, err, out)
		}
	}
	if tb.forwardRule != nil {
		if out, err := exec.Command("iptables", append([]string{"-D"}, tb.forwardRule...)...).CombinedOutput(); err != nil {
			tb.t.Errorf("testbed cleanup: iptables -D %v: %v\n%s", tb.forwardRule, err, out)
		}
	}
	if out, err := exec.Command("ip", "link", "del", tb.bridge).CombinedOutput(); err != nil {
		tb.t.Errorf("testbed cleanup: ip link del %s: %v\n%s", tb.bridge, err, out)
	}
}

// cut takes the host's cable out: no packet in or out, the process runs on.
func (h *testHost) cut() { h.tb.must("ip", "link", "set", h.outer, "down") }

// heal puts it back.
func (h *testHost) heal() { h.tb.must("ip", "link", "set", h.outer, "up") }

// muteGossip drops every packet the host sends from or to port, UDP and TCP
// alike (iptables in the host's namespace: this kernel has no tc drop
// action): its gossip falls silent while its other ports keep working, as a
// host too loaded to answer probes in time looks to the others. The rules
// go with the namespace; unmuteGossip removes them before.
func (h *testHost) muteGossip(port string) {
	if _, err := exec.LookPath("iptables"); err != nil {
		h.tb.t.Fatalf("testbed: muting a host's gossip needs iptables: %v", err)
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, dir := range []string{"--sport", "--dport"} {
			h.tb.must("ip", "netns", "exec", h.ns, "iptables", "-A", "OUTPUT", "-p", proto, dir, port, "-j", "DROP")
		}
	}
}

func (h *testHost) unmuteGossip() { h.tb.must("ip", "netns", "exec", h.ns, "iptables", "-F", "OUTPUT") }

var sentBytes = regexp.MustCompile(`class htb 1:20 [^\n]*\n\s*Sent (\d+) bytes`)

// crossHostBytes is what the host has sent to other hosts so far.
func (h *testHost) crossHostBytes() uint64 {
	h.tb.t.Helper()
	out := h.tb.output("tc", "-n", h.ns, "-s", "class", "show", "dev", "eth0")
	m := sentBytes.FindSubmatch(out)
	if m == nil {
		h.tb.t.Fatalf("tc class show in %s: no counter for class 1:20 in\n%s", h.ns, out)
	}
	n, err := strconv.ParseUint(string(m[1]), 10, 64)
	if err != nil {
		h.tb.t.Fatal(err)
	}
	return n
}

var qdiscDropped = regexp.MustCompile(`dropped (\d+)`)

// lossCounters are the host's counts of packets lost on the way and of the
// kernel's symptoms of loss, by name: qdisc drops on its link, and every
// counter of /proc/net/snmp and /proc/net/netstat (the namespace's own)
// whose name speaks of a drop, an overflow, a resend, a failure or a timeout.
// For failure messages: where a dial that timed out lost its packets.
func (h *testHost) lossCounters() map[string]uint64 {
	h.tb.t.Helper()
	out := map[string]uint64{}
	tc := h.tb.output("tc", "-n", h.ns, "-s", "qdisc", "show", "dev", "eth0")
	for _, m := range qdiscDropped.FindAllSubmatch(tc, -1) {
		n, _ := strconv.ParseUint(string(m[1]), 10, 64)
		out["qdisc_dropped"] += n
	}
	for _, file := range []string{"/proc/net/snmp", "/proc/net/netstat"} {
		b := h.tb.output("ip", "netns", "exec", h.ns, "cat", file)
		// Pairs of lines: "TcpExt: Name Name ..." then "TcpExt: 1 2 ...".
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(names) == 0 || len(values) != len(names) {
				continue
			}
			for j, name := range names[1:] {
				if lossy.MatchString(name) {
					n, _ := strconv.ParseUint(values[j+1], 10, 64)
					out[strings.TrimSuffix(names[0], ":")+"."+name] = n
				}
			}
		}
	}
	return out
}

var lossy = regexp.MustCompile(`Drop|Overflow|Retrans|Fail|Timeout|Prune|Collapse|Discard|Err`)

// lossesSince sums over the hosts how much each loss counter grew since
// before (from lossCounters per host, in host order); those that did not
// grow are left out.
func (tb *testbed) lossesSince(before []map[string]uint64) map[string]uint64 {
	sum := map[string]uint64{}
	for i, h := range tb.hosts {
		for k, v := range h.lossCounters() {
			if d := v - before[i][k]; d > 0 {
				sum[k] += d
			}
		}
	}
	return sum
}

func (tb *testbed) lossCounters() []map[string]uint64 {
	out := make([]map[string]uint64, len(tb.hosts))
	for i, h := range tb.hosts {
		out[i] = h.lossCounters()
	}
	return out
}
