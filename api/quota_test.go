package api

import (
	"encoding/json"
	"testing"
)

// A quota travels as absent, a number or null, and each comes back as it
// went: a relayed lift must stay a lift, an absent quota must stay absent.
func TestQuotaJSON(t *testing.T) {
	for _, c := range []struct {
		q    Quota
		json string
	}{
		{Quota{}, `{"source":"s"}`},
		{QuotaOf(5), `{"source":"s","quota":5}`},
		{QuotaOf(0), `{"source":"s","quota":0}`},
		{NoQuota(), `{"source":"s","quota":null}`},
	} {
		b, err := json.Marshal(PutDataset{Source: "s", Quota: c.q})
		if err != nil || string(b) != c.json {
			t.Fatalf("%+v: %s %v; want %s", c.q, b, err, c.json)
		}
		var back PutDataset
		if err := json.Unmarshal(b, &back); err != nil || back.Quota != c.q {
			t.Fatalf("%s: back %+v %v", b, back.Quota, err)
		}
	}
	var p PutDataset
	for _, bad := range []string{`{"quota":"1GiB"}`, `{"quota":1.5}`, `{"quota":true}`, `{"quota":99999999999999999999}`} {
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("%s accepted as %+v", bad, p.Quota)
		}
	}
}
