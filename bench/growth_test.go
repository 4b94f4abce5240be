package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadVMStat(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       map[string]int64
	}{
		{name: "counters", text: "pgpgin 1162437\nworkingset_refault_file 70044\n", want: map[string]int64{"pgpgin": 1162437, "workingset_refault_file": 70044}},
		{name: "a line that is not a counter is skipped", text: "pgpgin 5\nnonsense\nnr_x abc\n", want: map[string]int64{"pgpgin": 5}},
		{name: "empty", text: "", want: map[string]int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "vmstat")
			if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			got := readVMStat(path)
			if len(got) != len(tc.want) {
				t.Fatalf("readVMStat = %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %d, want %d", k, got[k], v)
				}
			}
		})
	}
	if got := readVMStat(filepath.Join(t.TempDir(), "absent")); got != nil {
		t.Errorf("an unreadable file: %v, want nil", got)
	}
}

func TestVMDelta(t *testing.T) {
	a := map[string]int64{"workingset_refault_file": 100, "pgpgin": 2048}
	b := map[string]int64{"workingset_refault_file": 612, "pgpgin": 4096}
	for _, tc := range []struct {
		name  string
		a, b  map[string]int64
		key   string
		scale float64
		want  *float64
	}{
		{name: "refaulted pages of 4 KiB in MiB", a: a, b: b, key: "workingset_refault_file", scale: 4096.0 / (1 << 20), want: ptr(2.0)},
		{name: "KiB read in MiB", a: a, b: b, key: "pgpgin", scale: 1.0 / 1024, want: ptr(2.0)},
		{name: "a counter one reading lacks", a: a, b: map[string]int64{"pgpgin": 1}, key: "workingset_refault_file", scale: 1},
		{name: "no reading", a: nil, b: b, key: "pgpgin", scale: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vmDelta(tc.a, tc.b, tc.key, tc.scale)
			switch {
			case tc.want == nil && got != nil:
				t.Errorf("vmDelta = %v, want nil", *got)
			case tc.want != nil && (got == nil || *got != *tc.want):
				t.Errorf("vmDelta = %v, want %v", got, *tc.want)
			}
		})
	}
}

// TestWriteGrowthPrintsPageCache checks that the table's last two columns
// are the interval's refaulted and disk-read MiB, and a dash where the
// machine had no /proc/vmstat.
func TestWriteGrowthPrintsPageCache(t *testing.T) {
	g := &Growth{IntervalS: 10, DataDir: "/d", Rows: []GrowthRow{
		{FromS: 0, ToS: 10, Answers: 100, ClientP50MS: 10, ClientP95MS: 20, RefaultMiB: ptr(3.25), DiskReadMiB: ptr(7.5)},
		{FromS: 10, ToS: 20, Answers: 100, ClientP50MS: 10, ClientP95MS: 20},
	}}
	var out bytes.Buffer
	writeGrowth(&out, g)
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 4 {
		t.Fatalf("growth table:\n%s", out.String())
	}
	head := strings.Fields(lines[1])
	if got := strings.Join(head[len(head)-4:], " "); got != "io% refault disk rd" {
		t.Errorf("header ends %q, want %q", got, "io% refault disk rd")
	}
	for i, want := range []string{"3.2 7.5", "— —"} { // f1 rounds half to even
		cells := strings.Fields(lines[2+i])
		if got := strings.Join(cells[len(cells)-2:], " "); got != want {
			t.Errorf("row %d ends %q, want %q", i, got, want)
		}
	}
}
