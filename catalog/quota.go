package catalog

import "fmt"

// opSetQuota sets or lifts a dataset's memory quota. Its number stands apart
// from the iota block so that ops added there never renumber it.
const opSetQuota opType = 64

// setQuota replaces the dataset's entry by a copy with the new quota:
// entries are immutable once published. The version stays, since items,
// owners and orders do not change with a quota.
func (st *state) setQuota(c *command) any {
	d, ok := st.Datasets[c.Name]
	if !ok {
		return fmt.Errorf("%w: dataset %q", ErrNotFound, c.Name)
	}
	cp := *d
	cp.Quota = nil
	if c.Quota != nil {
		q := *c.Quota
		cp.Quota = &q
	}
	st.Datasets[c.Name] = &cp
	return &cp
}

// SetQuota sets the bytes of dataset name the cluster may cache (nil lifts
// the quota). Must run on the leader; whether the quota fits the cluster's
// memory is the caller's to check.
func (c *Catalog) SetQuota(name string, quota *uint64) (*Dataset, error) {
	res, err := c.apply(&command{Op: opSetQuota, Name: name, Quota: quota})
	if err != nil {
		return nil, err
	}
	return res.(*Dataset), nil
}
