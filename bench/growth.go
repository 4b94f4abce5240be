package bench

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Growth is what a run's time is spent on, interval by interval
// (--growth): the client's and each stage's latency beside what grows with
// the work done (the Temporal dev server's SQLite files, Kafka's log,
// Postgres' tables, its checkpoints and autovacuum runs, the Go heap and
// its GC pauses) and how busy the machine was. A latency that climbs while
// the offered rate stays the same shows here next to what grew with it.
type Growth struct {
	IntervalS float64     `json:"interval_s"`
	DataDir   string      `json:"data_dir"`
	Rows      []GrowthRow `json:"rows"`
	// Per30s is the client's latency over each 30 s of the run: what the
	// flatness target is judged on.
	Per30s []ClientWindow `json:"client_per_30s"`
	// Flatness is the target's check and the trend over the hold; nil when
	// the hold is shorter than 90 s.
	Flatness *Flatness `json:"flatness,omitempty"`
}

// ClientWindow is the client's answers that ended in [FromS, ToS).
type ClientWindow struct {
	FromS   float64 `json:"from_s"`
	ToS     float64 `json:"to_s"`
	Answers int     `json:"answers"`
	P50MS   float64 `json:"p50_ms"`
	P95MS   float64 `json:"p95_ms"`
	P99MS   float64 `json:"p99_ms"`
	// CPUMSPerAnswer is each part's CPU milliseconds (the --pid processes
	// and their children, and the generator) per answer, over the growth
	// intervals inside the window: a part slower per claim in the slow
	// windows did more work, or got less from its CPU.
	CPUMSPerAnswer map[string]float64 `json:"cpu_ms_per_answer,omitempty"`
}

// clientWindows cuts [0, end) into windows of w.
func clientWindows(samples []Sample, w, end time.Duration) []ClientWindow {
	var out []ClientWindow
	// A last window shorter than a second (the reading after the load's
	// end) holds no answer worth a row.
	for from := time.Duration(0); from < end-time.Second; from += w {
		to := min(from+w, end)
		var lat []float64
		for _, s := range samples {
			if s.End >= from && s.End < to && s.Outcome == OutcomeStatus {
				lat = append(lat, ms(s.Latency))
			}
		}
		sum := Summarize(lat)
		out = append(out, ClientWindow{FromS: from.Seconds(), ToS: to.Seconds(), Answers: len(lat), P50MS: sum.P50, P95MS: sum.P95, P99MS: sum.P99})
	}
	return out
}

// GrowthRow is one interval [FromS, ToS) of the run.
type GrowthRow struct {
	FromS       float64 `json:"from_s"`
	ToS         float64 `json:"to_s"`
	Answers     int     `json:"answers"`
	ClientP50MS float64 `json:"client_p50_ms"`
	ClientP95MS float64 `json:"client_p95_ms"`
	// Stages are the stage table's rows over the interval (nil when the
	// metrics were not read).
	Stages []StageRow `json:"stages,omitempty"`
	// Sizes in bytes at the interval's end; nil where not found.
	TemporalDB    *int64 `json:"temporal_db_bytes"`
	TemporalWAL   *int64 `json:"temporal_wal_bytes"`
	KafkaDir      *int64 `json:"kafka_dir_bytes"`
	PGTables      *int64 `json:"pg_tables_bytes"`
	PGIndexes     *int64 `json:"pg_indexes_bytes"`
	PGDeadTuples  *int64 `json:"pg_dead_tuples"`
	PGCheckpoints *int64 `json:"pg_checkpoints"` // in the interval
	PGAutovacuums *int64 `json:"pg_autovacuums"` // in the interval
	PGAutoanalyze *int64 `json:"pg_autoanalyzes"`
	// GC over the interval, and the heap at its end, of the processes
	// whose /metrics were read.
	GCPauseMS           *float64 `json:"gc_pause_ms"`
	GCCycles            *float64 `json:"gc_cycles"`
	HeapMB              *float64 `json:"heap_alloc_mb"`
	Goroutines          *float64 `json:"goroutines"`
	MachineBusyShare    *float64 `json:"machine_busy_share"`
	MachineIOStallShare *float64 `json:"machine_io_stall_share"`
	// MachineStealShare is the part of the machine's CPU time the virtual
	// machine's host took: it comes in bursts that slow every stage at once.
	MachineStealShare *float64 `json:"machine_steal_share"`
	// RefaultMiB is the file pages the machine read back in the interval
	// after its kernel had dropped them from the page cache
	// (/proc/vmstat's workingset_refault_file): a file read that went to
	// the disk for data the machine once held. DiskReadMiB is all it read
	// from its disks (pgpgin). Both count the whole machine.
	RefaultMiB  *float64 `json:"refault_mib"`
	DiskReadMiB *float64 `json:"disk_read_mib"`
	// CPU is each part's CPU over the interval.
	CPU []CPURow `json:"cpu,omitempty"`
}

// growthReading is a reading with the sizes and Postgres' counters.
type growthReading struct {
	reading
	temporalDB, temporalWAL, kafkaDir                 *int64
	tables, indexes, dead, ckpt, autovac, autoanalyze *int64
	vm                                                map[string]int64 // /proc/vmstat; nil if unreadable
}

// growthProbe reads every interval from the run's start until stop.
type growthProbe struct {
	interval time.Duration
	dataDir  string
	stop     chan struct{}
	done     chan struct{}

	mu       sync.Mutex
	readings []growthReading
}

func startGrowthProbe(ctx context.Context, interval time.Duration, dataDir string, db *pgxpool.Pool, urls []string, roots []int, start time.Time) *growthProbe {
	p := &growthProbe{interval: interval, dataDir: dataDir, stop: make(chan struct{}), done: make(chan struct{})}
	checkpointer := hasCheckpointerView(ctx, db)
	go func() {
		defer close(p.done)
		c := &http.Client{Timeout: 5 * time.Second}
		defer c.CloseIdleConnections()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-p.stop:
				return
			case <-time.After(time.Until(start.Add(time.Duration(i) * interval))):
			}
			r := growthReading{reading: takeReading(ctx, c, urls, roots, start)}
			r.sizes(dataDir)
			r.postgres(ctx, db, checkpointer)
			r.vm = readVMStat("/proc/vmstat")
			p.mu.Lock()
			p.readings = append(p.readings, r)
			p.mu.Unlock()
		}
	}()
	return p
}

func (r *growthReading) sizes(dir string) {
	if dir == "" {
		return
	}
	r.temporalDB = fileSize(filepath.Join(dir, "temporal.db"))
	r.temporalWAL = fileSize(filepath.Join(dir, "temporal.db-wal"))
	r.kafkaDir = dirSize(filepath.Join(dir, "kafka"))
}

func fileSize(path string) *int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	n := fi.Size()
	return &n
}

func dirSize(dir string) *int64 {
	var n int64
	found := false
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a segment removed meanwhile
		}
		found = true
		if fi, err := d.Info(); err == nil && !d.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	if !found {
		return nil
	}
	return &n
}

// postgres reads the tables' and indexes' sizes, their dead tuples, and the
// checkpoint and autovacuum counters (PostgreSQL 17 moved the checkpoints
// to pg_stat_checkpointer).
func (r *growthReading) postgres(ctx context.Context, db *pgxpool.Pool, checkpointer bool) {
	if db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var tables, indexes, dead, autovac, autoanalyze int64
	if db.QueryRow(ctx, `SELECT coalesce(sum(pg_table_size(relid)),0)::bigint, coalesce(sum(pg_indexes_size(relid)),0)::bigint,
		coalesce(sum(n_dead_tup),0)::bigint, coalesce(sum(autovacuum_count),0)::bigint, coalesce(sum(autoanalyze_count),0)::bigint
		FROM pg_stat_user_tables`).Scan(&tables, &indexes, &dead, &autovac, &autoanalyze) == nil {
		r.tables, r.indexes, r.dead, r.autovac, r.autoanalyze = &tables, &indexes, &dead, &autovac, &autoanalyze
	}
	var ckpt int64
	var err error
	if checkpointer {
		err = db.QueryRow(ctx, `SELECT (num_timed + num_requested)::bigint FROM pg_stat_checkpointer`).Scan(&ckpt)
	} else {
		err = db.QueryRow(ctx, `SELECT (checkpoints_timed + checkpoints_req)::bigint FROM pg_stat_bgwriter`).Scan(&ckpt)
	}
	if err == nil {
		r.ckpt = &ckpt
	}
}

// hasCheckpointerView says whether the server counts checkpoints in
// pg_stat_checkpointer (PostgreSQL 17 and later) rather than
// pg_stat_bgwriter. Asked once, so that no interval asks a view the server
// lacks and leaves an error in its log.
func hasCheckpointerView(ctx context.Context, db *pgxpool.Pool) bool {
	if db == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var version int
	return db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version) == nil && version >= 170000
}

// result stops the probe and turns its readings into rows, each with the
// client's answers that ended in it.
func (p *growthProbe) result(samples []Sample, run LatencySummary, holdFrom, holdTo time.Duration) *Growth {
	close(p.stop)
	<-p.done
	g := &Growth{IntervalS: p.interval.Seconds(), DataDir: p.dataDir}
	for i := 1; i < len(p.readings); i++ {
		a, b := p.readings[i-1], p.readings[i]
		row := GrowthRow{FromS: round3(a.at.Seconds()), ToS: round3(b.at.Seconds()),
			TemporalDB: b.temporalDB, TemporalWAL: b.temporalWAL, KafkaDir: b.kafkaDir,
			PGTables: b.tables, PGIndexes: b.indexes, PGDeadTuples: b.dead,
			PGCheckpoints: delta(a.ckpt, b.ckpt), PGAutovacuums: delta(a.autovac, b.autovac), PGAutoanalyze: delta(a.autoanalyze, b.autoanalyze)}
		c := clientRow(samples, a.at, b.at)
		row.Answers, row.ClientP50MS, row.ClientP95MS = int(c.Count), *c.P50MS, *c.P95MS
		if a.hist != nil && b.hist != nil {
			row.Stages = stageRows(diffHistograms(a.hist, b.hist))
		}
		if a.sc != nil && b.sc != nil {
			if s, ok := b.sc["go_gc_duration_seconds_sum"]; ok {
				row.GCPauseMS = ptr(round3((s - a.sc["go_gc_duration_seconds_sum"]) * 1000))
				row.GCCycles = ptr(b.sc["go_gc_duration_seconds_count"] - a.sc["go_gc_duration_seconds_count"])
			}
			if h, ok := b.sc["go_memstats_heap_alloc_bytes"]; ok {
				row.HeapMB = ptr(round3(h / (1 << 20)))
			}
			if n, ok := b.sc["go_goroutines"]; ok {
				row.Goroutines = ptr(n)
			}
		}
		if a.cpu.procs != nil && b.cpu.procs != nil {
			row.MachineBusyShare = machineBusy(a.cpu, b.cpu)
			row.MachineIOStallShare = machineIOStall(a.cpu, b.cpu, (b.at - a.at).Seconds())
			row.MachineStealShare = machineSteal(a.cpu, b.cpu)
			row.CPU = cpuRows(a.cpu, b.cpu, (b.at - a.at).Seconds(), runtime.NumCPU())
		}
		row.RefaultMiB = vmDelta(a.vm, b.vm, "workingset_refault_file", float64(os.Getpagesize())/(1<<20))
		row.DiskReadMiB = vmDelta(a.vm, b.vm, "pgpgin", 1.0/1024) // pgpgin counts KiB
		g.Rows = append(g.Rows, row)
	}
	if n := len(p.readings); n > 0 {
		g.Per30s = clientWindows(samples, 30*time.Second, p.readings[n-1].at)
		for i := range g.Per30s {
			g.Per30s[i].CPUMSPerAnswer = cpuPerAnswer(g.Rows, g.Per30s[i].FromS, g.Per30s[i].ToS)
		}
	}
	g.Flatness = flatness(samples, run, g.Rows, holdFrom, holdTo)
	return g
}

// cpuPerAnswer is each part's CPU ms per answer over the rows that lie in
// [from, to], or nil when they hold no answer or no CPU reading.
func cpuPerAnswer(rows []GrowthRow, from, to float64) map[string]float64 {
	cpuS := map[string]float64{}
	answers := 0
	for _, r := range rows {
		if r.FromS < from-0.5 || r.ToS > to+0.5 || r.CPU == nil {
			continue
		}
		answers += r.Answers
		for _, c := range r.CPU {
			cpuS[c.Process] += c.CPUS
		}
	}
	if answers == 0 || len(cpuS) == 0 {
		return nil
	}
	out := map[string]float64{}
	for part, s := range cpuS {
		out[part] = round3(s * 1000 / float64(answers))
	}
	return out
}

// readVMStat reads the kernel's memory counters (name value per line), or
// nil when there are none (not Linux).
func readVMStat(path string) map[string]int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	for line := range strings.Lines(string(b)) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if n, err := strconv.ParseInt(value, 10, 64); ok && err == nil {
			out[name] = n
		}
	}
	return out
}

// vmDelta is counter name's growth from a to b times scale, or nil when
// either reading lacks it.
func vmDelta(a, b map[string]int64, name string, scale float64) *float64 {
	va, oka := a[name]
	vb, okb := b[name]
	if !oka || !okb {
		return nil
	}
	return ptr(round3(float64(vb-va) * scale))
}

func delta(a, b *int64) *int64 {
	if a == nil || b == nil {
		return nil
	}
	d := *b - *a
	return &d
}

// growthColumns are the stages the printed table shows (p95, ms); --json
// has every stage's p50 and p95.
var growthColumns = []struct{ head, stage string }{
	{"batcher", "batcher wait"},
	{"update", "batch update round trip"},
	{"wf task", "workflow task execution"},
	{"reserve", "ReserveSeats (local activity)"},
	{"publish", "PublishBatch (local activity)"},
	{"respond", "RespondWorkflowTaskCompleted"},
}

// writeGrowth prints the growth table.
func writeGrowth(w io.Writer, g *Growth) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("  growth, every %gs (latencies p95 in ms unless named; sizes in MiB at the interval's end; checkpoints, autovacuum runs, GC, refaulted and disk-read MiB in the interval; %s):\n",
		g.IntervalS, g.DataDir)
	head := []string{"from s", "answers", "cli p50", "cli p95"}
	for _, c := range growthColumns {
		head = append(head, c.head)
	}
	head = append(head, "batch p50", "tdb", "twal", "kafka", "pg tbl", "pg idx", "dead k", "ckpt", "autovac", "gc ms", "gc n", "heap", "busy%", "steal%", "io%", "refault", "disk rd")
	for _, h := range head {
		p(" %8s", h)
	}
	p("\n")
	mib := func(v *int64) string {
		if v == nil {
			return "—"
		}
		return f1(float64(*v) / (1 << 20))
	}
	num := func(v *int64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprint(*v)
	}
	flt := func(v *float64, scale float64) string {
		if v == nil {
			return "—"
		}
		return f1(*v * scale)
	}
	for _, r := range g.Rows {
		cells := []string{f1(r.FromS), fmt.Sprint(r.Answers), f1(r.ClientP50MS), f1(r.ClientP95MS)}
		for _, c := range growthColumns {
			cells = append(cells, stageCell(r.Stages, c.stage, false))
		}
		dead := "—"
		if r.PGDeadTuples != nil {
			dead = f1(float64(*r.PGDeadTuples) / 1000)
		}
		cells = append(cells, stageCell(r.Stages, "claims per batch", true),
			mib(r.TemporalDB), mib(r.TemporalWAL), mib(r.KafkaDir), mib(r.PGTables), mib(r.PGIndexes), dead,
			num(r.PGCheckpoints), num(r.PGAutovacuums), flt(r.GCPauseMS, 1), flt(r.GCCycles, 1), flt(r.HeapMB, 1),
			flt(r.MachineBusyShare, 100), flt(r.MachineStealShare, 100), flt(r.MachineIOStallShare, 100),
			flt(r.RefaultMiB, 1), flt(r.DiskReadMiB, 1))
		for _, c := range cells {
			p(" %8s", c)
		}
		p("\n")
	}
	p("  the client per 30 s (answers, p50 / p95 / p99 ms; CPU ms per answer of each part):\n")
	for _, c := range g.Per30s {
		p("    %5.0f–%-5.0fs %7d  %6.1f / %6.1f / %6.1f", c.FromS, c.ToS, c.Answers, c.P50MS, c.P95MS, c.P99MS)
		parts := slices.Sorted(maps.Keys(c.CPUMSPerAnswer))
		var all float64
		for _, part := range parts {
			p("  %s %.3f", part, c.CPUMSPerAnswer[part])
			all += c.CPUMSPerAnswer[part]
		}
		if len(parts) > 0 {
			p("  all %.3f", all)
		}
		p("\n")
	}
	if g.Flatness != nil {
		writeFlatness(w, g.Flatness)
	}
}

// stageCell is a stage's p95 in ms, or for the claims per batch its p50.
func stageCell(rows []StageRow, name string, claims bool) string {
	for _, r := range rows {
		if r.Name != name || r.Count == 0 {
			continue
		}
		if claims {
			return f1(*r.P50)
		}
		return f1(*r.P95MS)
	}
	return "—"
}
