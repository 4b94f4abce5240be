package bench

import (
	"slices"
	"strings"

	"github.com/prometheus/procfs"
)

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// the bench runs on.
const clockTicks = 100

// procStat is what the bench reads of /proc/PID/stat.
type procStat struct {
	pid, ppid int
	comm      string
	// ticks is utime+stime+cutime+cstime: the process's own CPU time and
	// that of its children it reaped, so a worker process that exits
	// between two readings (a Postgres backend) still counts, in its
	// parent's row.
	ticks uint64
	// start is the process's start time in ticks since boot; with the PID
	// it tells a process from a later one with the same PID.
	start uint64
}

// procFS is where the bench reads processes and the machine's counters:
// /proc, or a fixture in tests.
var procFS = procfs.DefaultMountPoint

// readProcs reads every process's stat; processes that end while it reads
// are left out.
func readProcs(fs procfs.FS) (map[int]procStat, error) {
	all, err := fs.AllProcs()
	if err != nil {
		return nil, err
	}
	out := make(map[int]procStat, len(all))
	for _, p := range all {
		st, err := p.Stat()
		if err != nil {
			continue
		}
		out[st.PID] = procStat{
			pid: st.PID, ppid: st.PPID, comm: st.Comm, start: st.Starttime,
			// cutime and cstime are signed in the kernel's format.
			ticks: uint64(st.UTime) + uint64(st.STime) + uint64(max(st.CUTime, 0)) + uint64(max(st.CSTime, 0)),
		}
	}
	return out, nil
}

// benchGroup names the bench process's own row.
const benchGroup = "bench (generator)"

// cpuGroups sorts processes into the rows of the CPU table: each root and
// all its descendants by command name, and the bench process (self) as the
// generator's row, or, when it is itself in a tree (the stack in the same
// process, as in tests), as its command name with the generator noted.
func cpuGroups(procs map[int]procStat, roots []int, self int) map[int]string {
	children := map[int][]int{}
	for pid, st := range procs {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	group := map[int]string{}
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		st, ok := procs[pid]
		if _, seen := group[pid]; !ok || seen {
			continue
		}
		group[pid] = st.comm
		queue = append(queue, children[pid]...)
	}
	if _, inTree := group[self]; inTree {
		group[self] = procs[self].comm + " + " + benchGroup
	} else if _, ok := procs[self]; ok {
		group[self] = benchGroup
	}
	return group
}

// cpuSnapshot is the CPU time of each process of the table's rows, and the
// machine's CPU and disk-wait counters, at one moment.
type cpuSnapshot struct {
	procs map[int]procStat
	group map[int]string
	// busy, steal and total are the machine's CPU seconds from /proc/stat
	// (busy is total less idle and iowait; steal, in busy, is the time a
	// virtual machine's CPUs waited for the host); machineOK is false when
	// it could not be read.
	busy, steal, total float64
	machineOK          bool
	// ioStall is /proc/pressure/io's "some" total: the microseconds in
	// which at least one task waited for the disk (a slow flush shows
	// here); ioOK is false when the kernel does not report it.
	ioStall uint64
	ioOK    bool
}

// cpuModel is the first CPU's model name, or "" where /proc/cpuinfo does
// not give one.
func cpuModel() string {
	fs, err := procfs.NewFS(procFS)
	if err != nil {
		return ""
	}
	info, err := fs.CPUInfo()
	if err != nil || len(info) == 0 {
		return ""
	}
	return info[0].ModelName
}

func takeCPUSnapshot(roots []int, self int) (cpuSnapshot, error) {
	fs, err := procfs.NewFS(procFS)
	if err != nil {
		return cpuSnapshot{}, err
	}
	procs, err := readProcs(fs)
	if err != nil {
		return cpuSnapshot{}, err
	}
	s := cpuSnapshot{procs: procs, group: cpuGroups(procs, roots, self)}
	if st, err := fs.Stat(); err == nil {
		c := st.CPUTotal // guest time is already in user
		s.total = c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
		s.busy, s.steal, s.machineOK = s.total-c.Idle-c.Iowait, c.Steal, true
	}
	if psi, err := fs.PSIStatsForResource("io"); err == nil && psi.Some != nil {
		s.ioStall, s.ioOK = psi.Some.Total, true
	}
	return s, nil
}

// CPURow is one row of the CPU table: a command name's processes, their
// CPU seconds over the window, and their share of all the machine's CPUs.
type CPURow struct {
	Process string  `json:"process"`
	PIDs    []int   `json:"pids"`
	CPUS    float64 `json:"cpu_s"`
	Share   float64 `json:"share"`
}

// cpuRows is what each row's processes used between a and b: the sum of
// the row's ticks at b less the sum at a (a process gone by b left its
// time to its parent's reaped-children ticks), never below zero.
func cpuRows(a, b cpuSnapshot, windowS float64, cpus int) []CPURow {
	before, after := map[string]uint64{}, map[string]uint64{}
	pids := map[string][]int{}
	for pid, g := range a.group {
		if st, ok := b.procs[pid]; ok && st.start == a.procs[pid].start && b.group[pid] == "" {
			continue // left the tree (reparented): not counted at either end
		}
		before[g] += a.procs[pid].ticks
	}
	for pid, g := range b.group {
		if prev, ok := a.procs[pid]; ok && prev.start == b.procs[pid].start && a.group[pid] == "" {
			// Joined the tree during the window: only its time since.
			after[g] += b.procs[pid].ticks - min(prev.ticks, b.procs[pid].ticks)
		} else {
			after[g] += b.procs[pid].ticks
		}
		pids[g] = append(pids[g], pid)
	}
	names := make([]string, 0, len(after))
	for g := range after {
		names = append(names, g)
	}
	for g := range before {
		if _, ok := after[g]; !ok {
			names = append(names, g)
		}
	}
	var rows []CPURow
	for _, g := range names {
		var ticks uint64
		if after[g] > before[g] {
			ticks = after[g] - before[g]
		}
		slices.Sort(pids[g])
		r := CPURow{Process: g, PIDs: pids[g], CPUS: round3(float64(ticks) / clockTicks)}
		if windowS > 0 && cpus > 0 {
			r.Share = round3(r.CPUS / (windowS * float64(cpus)))
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(x, y CPURow) int {
		if x.CPUS != y.CPUS {
			if x.CPUS > y.CPUS {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Process, y.Process)
	})
	return rows
}

// machineBusy is the machine's busy share between a and b, or nil.
func machineBusy(a, b cpuSnapshot) *float64 {
	return machineShare(a, b, func(s cpuSnapshot) float64 { return s.busy })
}

// machineSteal is the share of the machine's CPU time between a and b
// that its host took (steal), nil if unknown.
func machineSteal(a, b cpuSnapshot) *float64 {
	return machineShare(a, b, func(s cpuSnapshot) float64 { return s.steal })
}

// machineIOStall is the share of the wall-clock time between a and b
// (windowS seconds) in which some task waited for the disk, nil if unknown.
func machineIOStall(a, b cpuSnapshot, windowS float64) *float64 {
	if !a.ioOK || !b.ioOK || b.ioStall < a.ioStall || windowS <= 0 {
		return nil
	}
	v := round3(float64(b.ioStall-a.ioStall) / 1e6 / windowS)
	return &v
}

// machineShare is part's share of the machine's ticks between a and b, or
// nil when /proc/stat was unreadable at either end.
func machineShare(a, b cpuSnapshot, part func(cpuSnapshot) float64) *float64 {
	if !a.machineOK || !b.machineOK || b.total <= a.total || part(b) < part(a) {
		return nil
	}
	v := round3(float64(part(b)-part(a)) / float64(b.total-a.total))
	return &v
}
