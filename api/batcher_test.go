package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

func claim(course, student string) *pendingClaim {
	return &pendingClaim{in: workflows.EnrollmentInput{CourseID: course, StudentID: student}}
}

// A batch run lists its students and courses in search attributes whose
// values Temporal caps in size; the builder must close a batch before a
// value would pass the cap, whatever the claim count allows.
func TestBatchBuilderKeepsSearchAttributesWithinTheirLimit(t *testing.T) {
	tests := []struct {
		name      string
		opts      BatchOptions
		claims    []*pendingClaim
		wantAdded int
	}{
		{
			name:      "claim count bounds the batch",
			opts:      BatchOptions{MaxBatch: 3, MaxAttrBytes: 2000},
			claims:    []*pendingClaim{claim("c", "a"), claim("c", "b"), claim("c", "d"), claim("c", "e")},
			wantAdded: 3,
		},
		{
			name: "student list bytes bound the batch",
			// 64-byte IDs cost 67 bytes each: 29 fit in 2000.
			opts: BatchOptions{MaxBatch: 250, MaxAttrBytes: 2000},
			claims: func() []*pendingClaim {
				var out []*pendingClaim
				for i := range 40 {
					out = append(out, claim("c", fmt.Sprintf("%064d", i)))
				}
				return out
			}(),
			wantAdded: 29,
		},
		{
			name: "course list bytes bound the batch",
			opts: BatchOptions{MaxBatch: 250, MaxAttrBytes: 200},
			claims: func() []*pendingClaim {
				var out []*pendingClaim
				for i := range 10 {
					out = append(out, claim(strings.Repeat("x", 40)+fmt.Sprint(i), "s"))
				}
				return out
			}(),
			wantAdded: 4, // 4 × 44 = 176; a fifth would make 220
		},
		{
			name:      "a repeated student or course costs nothing more",
			opts:      BatchOptions{MaxBatch: 250, MaxAttrBytes: 10},
			claims:    []*pendingClaim{claim("c", "abc"), claim("c", "abc"), claim("c", "abc")},
			wantAdded: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatchBuilder(tc.opts)
			for _, p := range tc.claims {
				if len(b.claims) > 0 && !b.fits(p) {
					break
				}
				b.add(p)
			}
			if len(b.claims) != tc.wantAdded {
				t.Fatalf("batch holds %d claims, want %d", len(b.claims), tc.wantAdded)
			}
			if b.studentBytes > tc.opts.MaxAttrBytes || b.courseBytes > tc.opts.MaxAttrBytes {
				t.Fatalf("attribute bytes %d/%d exceed %d", b.studentBytes, b.courseBytes, tc.opts.MaxAttrBytes)
			}
		})
	}
}
