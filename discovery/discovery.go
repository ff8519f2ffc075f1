// Package discovery turns the --join seeds into gossip addresses and holds
// the StatefulSet bootstrap rule. A seed may be a DNS name, such as a
// Kubernetes headless Service, that resolves to every pod behind it; it is
// resolved again on every attempt, since pods come and go and a name looked
// up before its pods started lists none of them.
package discovery

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Resolver looks host names up. *net.Resolver satisfies it; tests inject a
// table (no DNS server is reachable in them).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// LookupTimeout bounds one seed's lookup: a DNS server that does not answer
// delays one join attempt by at most this, and the next attempt asks again.
const LookupTimeout = 5 * time.Second

// Expand resolves each host:port seed to an ip:port for every address its
// host has, in the seeds' order, without duplicates; IP seeds are kept as
// they are. A seed that does not resolve (yet) is left out and its error
// returned beside the addresses the others gave: the caller joins what it
// has and tries again later. r nil means the system resolver.
func Expand(ctx context.Context, r Resolver, seeds []string) ([]string, error) {
	if r == nil {
		r = net.DefaultResolver
	}
	var out, errs []string
	seen := map[string]bool{}
	add := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			out = append(out, addr)
		}
	}
	for _, s := range seeds {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%q: want HOST:PORT", s))
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			add(net.JoinHostPort(ip.String(), port))
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, LookupTimeout)
		addrs, err := r.LookupHost(lctx, host)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", s, err))
			continue
		}
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil {
				add(net.JoinHostPort(ip.String(), port))
			}
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("discovery: resolving --join: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// Ordinal is the ordinal a StatefulSet gives a pod, read from the end of
// its name ("stallfree-2" → 2).
func Ordinal(name string) (int, error) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || i == len(name)-1 {
		return 0, fmt.Errorf("name %q does not end in -ORDINAL (a StatefulSet pod's name)", name)
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != name[i+1:] {
		return 0, fmt.Errorf("name %q does not end in -ORDINAL (a StatefulSet pod's name)", name)
	}
	return n, nil
}

// BootstrapsByOrdinal is the StatefulSet rule: the pod with ordinal 0
// bootstraps, every other one joins. Every pod starts at once (podManagement
// Parallel) and none can ask the others whether a cluster exists before
// gossip is up, so the choice must be one all of them make alike from what
// each knows alone: its name. The catalog bootstraps only on an empty data
// dir, so ordinal 0 restarted with its volume comes back as the member it
// was rather than founding a second cluster.
func BootstrapsByOrdinal(name string) (bool, error) {
	n, err := Ordinal(name)
	if err != nil {
		return false, err
	}
	return n == 0, nil
}
