package bench

import (
	"bytes"
	"image/color"
	"image/png"
	"net/http"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

func TestPercentileInterpolatesLikePercentileCont(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{
		{0, 1}, {50, 5.5}, {90, 9.1}, {95, 9.55}, {99, 9.91}, {100, 10},
	} {
		if got := Percentile(vals, c.p); !near(got, c.want) {
			t.Errorf("p%g = %g, want %g", c.p, got, c.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("percentile of nothing = %g", got)
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("percentile of one value = %g", got)
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }

func TestSummarizeSortsAndRounds(t *testing.T) {
	s := Summarize([]float64{30, 10, 20, 40})
	want := LatencySummary{Avg: 25, Min: 10, P50: 25, P90: 37, P95: 38.5, P99: 39.7, Max: 40}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
	if (Summarize(nil) != LatencySummary{}) {
		t.Fatal("summary of nothing is not zero")
	}
}

func TestSummarizeHTTPCountsLikeK6(t *testing.T) {
	ms := time.Millisecond
	samples := []Sample{
		{End: 100 * ms, Latency: 10 * ms, Status: 201},
		{End: 200 * ms, Latency: 20 * ms, Status: 201},
		{End: 300 * ms, Latency: 30 * ms, Status: 409},
		{End: 400 * ms, Latency: 40 * ms, Status: 503},
		{End: 500 * ms, Latency: 50 * ms, Status: 404},
		{End: 600 * ms, Latency: 60 * ms, Outcome: OutcomeTimeout},
		{End: 700 * ms, Latency: 70 * ms, Outcome: OutcomeConn},
		{End: 800 * ms, Latency: 80 * ms, Status: 500},
	}
	h := SummarizeHTTP(samples, 2*time.Second)
	if h.Requests != 8 || h.AchievedRPS != 4 || h.OKRPS != 1.5 {
		t.Fatalf("requests %d, rps %g, ok rps %g", h.Requests, h.AchievedRPS, h.OKRPS)
	}
	wantStatus := map[string]int{"201": 2, "409": 1, "503": 1, "404": 1, "500": 1, "timeout": 1, "conn_error": 1}
	for k, v := range wantStatus {
		if h.Status[k] != v {
			t.Errorf("status[%s] = %d, want %d (all: %v)", k, h.Status[k], v, h.Status)
		}
	}
	if (h.Failures != Failures{Server: 2, Timeout: 1, Conn: 1, Other: 1}) {
		t.Errorf("failures = %+v", h.Failures)
	}
	if h.FailureRate != 0.625 {
		t.Errorf("failure rate = %g, want 5/8", h.FailureRate)
	}
	if h.Latency.Avg != 45 || h.Latency.Max != 80 || h.Latency.P50 != 45 {
		t.Errorf("latency = %+v", h.Latency)
	}
}

func TestTimelineBucketsBySecond(t *testing.T) {
	sc := Scenario{StartRate: 10, Stages: []Stage{{Duration: 2 * time.Second, Target: 10}}, MaxVUs: 1}
	samples := []Sample{
		{End: 100 * time.Millisecond, Latency: 5 * time.Millisecond, Status: 201},
		{End: 900 * time.Millisecond, Latency: 15 * time.Millisecond, Status: 503},
		{End: 2500 * time.Millisecond, Latency: 25 * time.Millisecond, Status: 201},
	}
	tl := Timeline(samples, []time.Duration{1500 * time.Millisecond}, sc)
	if len(tl) != 3 {
		t.Fatalf("%d seconds, want 3: %+v", len(tl), tl)
	}
	if tl[0].Requests != 2 || tl[0].Failed != 1 || tl[0].P50 != 10 || tl[0].Target != 10 {
		t.Errorf("second 0: %+v", tl[0])
	}
	if tl[1].Requests != 0 || tl[1].Dropped != 1 {
		t.Errorf("second 1: %+v", tl[1])
	}
	if tl[2].Requests != 1 || tl[2].P99 != 25 || tl[2].Target != 0 {
		t.Errorf("second 2: %+v", tl[2])
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"", 0, false},
		{"1", time.Second, true},
		{"0", 0, true},
		{"3600", maxRetryAfter, true},
		{now.Add(2 * time.Second).Format(http.TimeFormat), 2 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"soon", 0, false},
	} {
		h := http.Header{}
		if c.header != "" {
			h.Set("Retry-After", c.header)
		}
		got, ok := retryAfter(h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("Retry-After %q = %s, %v; want %s, %v", c.header, got, ok, c.want, c.ok)
		}
	}
}

func TestPlotIsAPNG(t *testing.T) {
	sc := QuickScenario()
	var samples []Sample
	for i := range 300 {
		samples = append(samples, Sample{End: time.Duration(i) * 20 * time.Millisecond, Latency: time.Duration(i%50) * time.Millisecond, Status: 201})
	}
	r := &Result{Name: "claimflow", Timeline: Timeline(samples, nil, sc)}
	var buf bytes.Buffer
	if err := WritePlot(&buf, r, r); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	// Two arms, two panels each, stacked.
	wantW, wantH := int(panelWidth/vg.Inch*plotDPI), int(4*panelHeight/vg.Inch*plotDPI)
	if b := img.Bounds(); b.Dx() != wantW || b.Dy() != wantH {
		t.Fatalf("plot is %v, want %dx%d", b, wantW, wantH)
	}
	// Something was drawn in each panel: not a blank canvas.
	for panel := range 4 {
		y0 := panel * wantH / 4
		colours := map[color.RGBA]bool{}
		for y := y0; y < y0+wantH/4; y += 3 {
			for x := 0; x < wantW; x += 3 {
				r, g, b, a := img.At(x, y).RGBA()
				colours[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}] = true
			}
		}
		if len(colours) < 3 {
			t.Errorf("panel %d has %d colours: nothing drawn", panel, len(colours))
		}
	}
}

func TestAcceptedID(t *testing.T) {
	created := []byte(`{"id":"e1","status":"reserved"}`)
	joined := []byte(`{"error":{"code":"already_enrolled","message":"x"},"enrollment_id":"e2"}`)
	full := []byte(`{"error":{"code":"course_full","message":"x"}}`)
	for _, c := range []struct {
		status int
		body   []byte
		retry  bool
		want   string
	}{
		{201, created, false, "e1"},
		{201, created, true, "e1"},
		{409, joined, false, ""}, // a real second enrollment of the same student
		{409, joined, true, "e2"},
		{409, full, true, ""},
		{503, []byte(`{}`), true, ""},
	} {
		if got := acceptedID(c.status, c.body, c.retry); got != c.want {
			t.Errorf("acceptedID(%d, %s, retry=%v) = %q, want %q", c.status, c.body, c.retry, got, c.want)
		}
	}
}
