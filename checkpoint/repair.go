package checkpoint

import (
	"context"
	"net/http"
	"slices"
	"time"

	"stallfree/catalog"
)

// repairSteps is how many of a checkpoint's newest committed steps get
// their second copy back when a holder is gone for good.
const repairSteps = 2

// holderKey names one member's copy of a part.
type holderKey struct {
	name   string
	step   uint64
	part   string
	member string
}

// repairState is what the leader's repair remembers between ticks.
type repairState struct {
	deadSince map[string]time.Time
	// missing are copies the catalog names that their live holder does not
	// have (it restarted, empty): as good as dead, with no grace.
	missing map[holderKey]bool
	ticks   int
}

func newRepairState() *repairState {
	return &repairState{deadSince: map[string]time.Time{}, missing: map[holderKey]bool{}}
}

// verifyEvery is how many ticks pass between asking holders what they hold.
const verifyEvery = 5

// repair runs on the leader every tick. A holder missing from the live
// members for longer than DeadGrace has left for good, and a live holder
// that no longer has its copy (restarted) has lost it: the pairs are
// recomputed over the members left, and every part of the newest two
// committed steps with fewer than two copies is copied to the surviving
// holder's partner (from that holder), or, when no holder is left, to a
// live pair from the persisted copy. The catalog then records the new
// holders, which "replicas" shows.
func (s *Service) repair(rs *repairState) {
	members := s.members.Members()
	live := map[string]bool{}
	for _, m := range members {
		live[m] = true
		delete(rs.deadSince, m)
	}
	if rs.ticks%verifyEvery == 0 {
		rs.missing = s.verifyHolders(live)
	}
	rs.ticks++
	now := time.Now()
	for _, ck := range s.cat.Checkpoints() {
		steps := ck.Steps[max(0, len(ck.Steps)-repairSteps):]
		for _, st := range steps {
			var fixed []catalog.CheckpointPart
			for _, p := range st.Parts {
				holding := func(h string) bool { return live[h] && !rs.missing[holderKey{ck.Name, st.Step, p.Name, h}] }
				n := 0
				for _, h := range p.Holders {
					if holding(h) {
						n++
					}
				}
				if n >= 2 || len(members) < 2 {
					continue
				}
				gone := true
				for _, h := range p.Holders {
					if holding(h) || live[h] {
						continue // held, or live and empty: lost now, no grace
					}
					if _, ok := rs.deadSince[h]; !ok {
						rs.deadSince[h] = now
					}
					if now.Sub(rs.deadSince[h]) < s.cfg.DeadGrace {
						gone = false
					}
				}
				if !gone {
					continue
				}
				if np, ok := s.repairPart(ck.Name, st, p, members, holding); ok {
					fixed = append(fixed, np)
					for _, h := range np.Holders {
						delete(rs.missing, holderKey{ck.Name, st.Step, p.Name, h})
					}
				}
			}
			if len(fixed) == 0 {
				continue
			}
			if err := s.cat.SetCheckpointHolders(ck.Name, st.Step, fixed); err != nil {
				s.log.Warn("checkpoint re-replication: recording holders", "name", ck.Name, "step", st.Step, "err", err)
				continue
			}
			s.repaired.Add(uint64(len(fixed)))
		}
	}
}

// verifyHolders asks every live holder of the newest steps' parts what it
// holds, and returns the copies the catalog names that are not there. A
// holder that does not answer is left to the dead-member rule.
func (s *Service) verifyHolders(live map[string]bool) map[holderKey]bool {
	missing := map[holderKey]bool{}
	for _, ck := range s.cat.Checkpoints() {
		for _, st := range ck.Steps[max(0, len(ck.Steps)-repairSteps):] {
			asked := map[string]map[string]string{} // member → part → sum
			for _, p := range st.Parts {
				for _, h := range p.Holders {
					if !live[h] {
						continue
					}
					got, ok := asked[h]
					if !ok {
						got = s.heldBy(h, ck.Name, st.Step)
						asked[h] = got
					}
					if got != nil && got[p.Name] != p.Sum {
						missing[holderKey{ck.Name, st.Step, p.Name, h}] = true
					}
				}
			}
		}
	}
	return missing
}

// heldBy is member m's parts of a step (part → sum); nil when m does not answer.
func (s *Service) heldBy(m, name string, step uint64) map[string]string {
	var held []HeldPart
	if m == s.cfg.Self {
		held = s.Held(name, step, false)
	} else {
		addr, ok := s.members.MemberHTTP(m)
		if !ok || s.doJSON(s.ctx, http.MethodGet, addr, internalPath(name, step, ""), &held) != nil {
			return nil
		}
	}
	out := map[string]string{}
	for _, h := range held {
		out[h.Part] = h.Sum
	}
	return out
}

// repairPart gives one part its second live copy and returns it with its
// holders now.
func (s *Service) repairPart(name string, st *catalog.CheckpointStep, p catalog.CheckpointPart, members []string, holding func(string) bool) (catalog.CheckpointPart, bool) {
	ctx, cancel := context.WithTimeout(s.ctx, copyDeadline(p.Size, s.cfg.PeerIdle))
	defer cancel()
	var holders []string
	for _, h := range p.Holders {
		if holding(h) {
			holders = append(holders, h)
		}
	}
	log := s.log.With("name", name, "step", st.Step, "part", p.Name)
	if len(holders) == 1 {
		src := holders[0]
		target, ok := Partner(members, src)
		if !ok || slices.Contains(holders, target) {
			return p, false
		}
		if err := s.copyBetween(ctx, name, st.Step, p.Name, src, target); err != nil {
			log.Warn("checkpoint re-replication failed", "from", src, "to", target, "err", err)
			return p, false
		}
		log.Info("checkpoint part re-replicated", "from", src, "to", target)
		p.Holders = []string{src, target}
		return p, true
	}
	// No copy in memory: from the persisted one, to a pair of live members.
	if !st.Persisted || s.persist == nil {
		return p, false
	}
	targets := Group(members, members[int(st.Version)%len(members)])[:2]
	for _, t := range targets {
		addr, ok := s.members.MemberHTTP(t)
		if !ok {
			return p, false
		}
		rc, size, err := s.persist.Open(ctx, objectKey(name, st.Step, p.Name))
		if err != nil {
			log.Warn("checkpoint re-replication from the persisted copy", "err", err)
			return p, false
		}
		err = s.sendReplica(ctx, addr, PutRequest{Name: name, Step: st.Step, Part: p.Name, Sum: p.Sum, Size: size,
			Replica: true, Repair: true}, rc)
		rc.Close()
		if err != nil {
			log.Warn("checkpoint re-replication from the persisted copy", "to", t, "err", err)
			return p, false
		}
	}
	log.Info("checkpoint part restored from the persisted copy", "to", targets)
	p.Holders = slices.Clone(targets)
	return p, true
}

// minCopyRate is the slowest a repair's copy may go before it is given up
// (and tried again on a later round). The copy is one request whose answer
// comes at its end, so a frozen source (SIGSTOP, a paused VM) is only seen
// by its deadline; repairs run one at a time on the leader, and a fixed
// 10 minutes held every other repair and persist behind one frozen member.
const minCopyRate = 4 << 20 // bytes per second

// copyDeadline is the time a repair of a part of size bytes may take: the
// peer idle time, and the bytes sent at most twice (to two targets, from
// the persisted copy) at minCopyRate; never more than maxCopyTime, the
// bound all repairs had before, since one frozen member holds the others
// for as long.
func copyDeadline(size int64, idle time.Duration) time.Duration {
	return min(idle+time.Duration(2*max(size, 0)/minCopyRate+1)*time.Second, maxCopyTime)
}

const maxCopyTime = 10 * time.Minute

// copyBetween has member src send its copy of a part to member dst.
func (s *Service) copyBetween(ctx context.Context, name string, step uint64, part, src, dst string) error {
	dstAddr, ok := s.members.MemberHTTP(dst)
	if !ok {
		return ErrUnavailable
	}
	if src == s.cfg.Self {
		return s.CopyTo(ctx, name, step, part, dstAddr)
	}
	srcAddr, ok := s.members.MemberHTTP(src)
	if !ok {
		return ErrUnavailable
	}
	resp, err := s.call(ctx, http.MethodPost, srcAddr, internalPath(name, step, "/parts/"+part+"/copy?to="+dstAddr), http.StatusNoContent)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
