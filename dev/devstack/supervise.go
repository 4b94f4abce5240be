package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Supervised is one process of the production-shaped stack (an API, a
// worker, the consumer), started again when it exits on its own, as
// compose's `restart: unless-stopped` and a Kubernetes Deployment do. A
// fault test kills it by the PID in PIDFile and watches it come back.
type Supervised struct {
	Name    string
	LogFile string
	PIDFile string

	argv []string
	env  []string
	log  *slog.Logger

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	starts   int
	exited   chan struct{} // closed when the current process exits
	done     chan struct{} // closed when supervision ends
}

// restartDelay is how long a process that exited stays down.
const restartDelay = time.Second

// Supervise starts argv with env and keeps it running until Stop.
func Supervise(name string, argv, env []string, logFile, pidFile string, log *slog.Logger) (*Supervised, error) {
	// Copies: every restart must run what the first start ran, whatever
	// the caller does with its slices afterwards.
	p := &Supervised{Name: name, LogFile: logFile, PIDFile: pidFile, argv: slices.Clone(argv), env: slices.Clone(env), log: log, done: make(chan struct{})}
	if err := p.start(); err != nil {
		return nil, err
	}
	go p.watch()
	return p, nil
}

func (p *Supervised) start() error {
	out, err := openAppend(p.LogFile)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = groupAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	// Renamed into place: a reader never sees the file half-written.
	tmp := p.PIDFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p.PIDFile); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("write %s: %w", p.PIDFile, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.starts++
	p.mu.Unlock()
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

func (p *Supervised) watch() {
	defer close(p.done)
	for {
		p.mu.Lock()
		exited, cmd := p.exited, p.cmd
		p.mu.Unlock()
		<-exited
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
		p.log.Warn("process exited; restarting it", "process", p.Name, "state", cmd.ProcessState.String(), "in", restartDelay, "log", p.LogFile)
		time.Sleep(restartDelay)
		for {
			p.mu.Lock()
			stopping = p.stopping
			p.mu.Unlock()
			if stopping {
				return
			}
			err := p.start()
			if err == nil {
				break
			}
			p.log.Error("restart failed; trying again", "process", p.Name, "error", err)
			time.Sleep(restartDelay)
		}
	}
}

// PID is the running process's PID.
func (p *Supervised) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Starts counts the process's starts, the first one included.
func (p *Supervised) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Stop sends SIGTERM and waits for the process to exit, sending SIGKILL
// when ctx ends first.
func (p *Supervised) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	var err error
	select {
	case <-exited:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		err = fmt.Errorf("%s did not stop within its grace period: killed", p.Name)
	}
	<-p.done
	if st := cmd.ProcessState; err == nil && st != nil && !st.Success() {
		if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			err = errors.New(p.Name + " stopped with " + st.String() + "; see " + p.LogFile)
		}
	}
	return err
}
