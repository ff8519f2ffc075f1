package node

import (
	"errors"
	"fmt"
	"sync"
)

// ErrBusy means the node is assembling as many response bytes as
// --max-inflight-bytes allows; the API answers 503 with Retry-After.
var ErrBusy = errors.New("busy: too many response bytes in flight")

// ErrTooLarge means one response would need more than the whole in-flight
// budget; no retry can help (413).
var ErrTooLarge = errors.New("too large")

// Bounds of one batch response, a dataset batch or a job's minibatch alike.
const (
	MaxBatch      = 4096
	MaxBatchBytes = 512 << 20
)

// inflight bounds the bytes of responses being assembled at once, so a few
// huge batches cannot take memory far past --memory.
type inflight struct {
	mu          sync.Mutex
	used, limit uint64
}

// take charges n bytes, or fails without waiting: a caller told to come
// back later frees its connection, where a waiting one would hold it.
func (b *inflight) take(n uint64) error {
	if n > b.limit {
		return fmt.Errorf("%w: a response of %d bytes is over --max-inflight-bytes (%d)", ErrTooLarge, n, b.limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return fmt.Errorf("%w (%d of %d bytes)", ErrBusy, b.used, b.limit)
	}
	b.used += n
	return nil
}

// takeItem charges one item's fresh buffer, never more than the whole
// budget: an item larger than the budget (an item may be up to 1 GiB) is
// served alone rather than never. It returns what was charged.
func (b *inflight) takeItem(n uint64) (uint64, error) {
	n = min(n, b.limit)
	return n, b.take(n)
}

// topUp raises a charge made on a manifest's size to the bytes actually
// held: a derived dataset's manifest is its parent's, so a derived item is
// charged its parent item's size first. Never past the whole budget (a
// response larger than it is read alone). It returns the charge now.
func (b *inflight) topUp(charged, actual uint64) (uint64, error) {
	want := min(actual, b.limit)
	if want <= charged {
		return charged, nil
	}
	if err := b.take(want - charged); err != nil {
		return charged, err
	}
	return want, nil
}

func (b *inflight) give(n uint64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// chargeHeld raises a batch's charge, made on the manifest's sizes, to the
// bytes its items hold: a derived dataset's manifest is its parent's, so its
// items may hold more. The difference goes on the first item (a batch's
// items go back together). Past the budget the batch is released: ErrBusy.
func (b *inflight) chargeHeld(out []Item) ([]Item, error) {
	var charged, actual uint64
	for j := range out {
		charged += out[j].charged
		actual += uint64(len(out[j].Data))
	}
	if len(out) == 0 {
		return out, nil
	}
	now, err := b.topUp(charged, actual)
	if err != nil {
		for j := range out {
			out[j].Release()
		}
		return nil, err
	}
	out[0].charged += now - charged
	return out, nil
}
