package node

import (
	"bytes"
	"strconv"
)

// metricValue reads one unlabelled sample from Prometheus text. /metrics is
// open without a token, so a node can read its peers' figures even when the
// API is protected.
func metricValue(text []byte, name string) float64 {
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte(name+" ")); ok {
			v, _ := strconv.ParseFloat(string(bytes.TrimSpace(rest)), 64)
			return v
		}
	}
	return 0
}
