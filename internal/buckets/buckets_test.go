package buckets

import (
	"slices"
	"testing"
)

// Prometheus and the worker's binary search both need strictly ascending
// bounds; a fresh slice per call keeps one user's edit from reaching another.
func TestBoundsAscendAndAreCopies(t *testing.T) {
	for name, f := range map[string]func() []float64{"Seconds": Seconds, "Claims": Claims} {
		b := f()
		if !slices.IsSorted(b) || len(slices.Compact(slices.Clone(b))) != len(b) {
			t.Errorf("%s: %v is not strictly ascending", name, b)
		}
		b[0] = -1
		if f()[0] == -1 {
			t.Errorf("%s returns a shared slice", name)
		}
	}
}
