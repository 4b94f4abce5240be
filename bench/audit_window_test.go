package bench

import "testing"

func TestPeakWindowRate(t *testing.T) {
	tests := []struct {
		name        string
		perSecond   map[int64]int
		first, last int64
		window      int64
		want        float64
	}{
		{"empty", map[int64]int{}, 0, 0, 10, 0},
		{"shorter than the window", map[int64]int{100: 10, 101: 30}, 100, 101, 10, 20},
		{"a ramp, a plateau, a ramp down", map[int64]int{0: 100, 1: 500, 2: 2000, 3: 2000, 4: 2000, 5: 500}, 0, 5, 3, 2000},
		{"a spike does not make a plateau", map[int64]int{0: 1000, 1: 6000, 2: 1000, 3: 1000}, 0, 3, 3, 2666.667},
		{"missing seconds count as zero", map[int64]int{0: 900, 2: 900}, 0, 2, 2, 450},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := peakWindowRate(tt.perSecond, tt.first, tt.last, tt.window); got != tt.want {
				t.Fatalf("peakWindowRate = %v, want %v", got, tt.want)
			}
		})
	}
}
