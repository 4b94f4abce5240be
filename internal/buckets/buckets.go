// Package buckets holds the histogram bucket bounds claimflow's latency
// metrics share, so the API's and the Temporal SDK's histograms can be read
// against each other (and diffed by the load tool) bucket for bucket. It
// imports nothing: the worker and the API may both use it.
package buckets

// Seconds returns the bounds of every latency histogram, in seconds: fine
// between 1 and 100 ms, where an enrollment's stages live, so a p50 there
// is read between bounds a few milliseconds apart, then coarse up to a
// long poll. Each call returns a fresh slice.
func Seconds() []float64 {
	return []float64{
		0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008,
		0.010, 0.012, 0.015, 0.020, 0.025, 0.030, 0.040, 0.050, 0.060, 0.080,
		0.100, 0.125, 0.150, 0.200, 0.250, 0.300, 0.400, 0.500,
		1, 2.5, 5, 10, 30, 60,
	}
}

// Claims returns the bounds of a count of claims in one batch, 1 to 1,000
// (CLAIM_BATCH_MAX is 500 by default).
func Claims() []float64 {
	return []float64{1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000}
}
