package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestHelpExitsZero: asking the built binary for help, of itself or of any
// command, prints usage and exits 0 (help was asked for, nothing failed);
// an unknown command exits 2. claimflow-bench's own test covers its
// commands.
func TestHelpExitsZero(t *testing.T) {
	bin := claimflowBinary(t)
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"},
		{"dev", "-h"}, {"api", "-h"}, {"worker", "-h"}, {"migrate", "-h"}, {"replay", "-h"},
		{"consumer", "-h"}, {"audit", "-h"}, {"token", "-h"}, {"payoutsim", "-h"}, {"notifysim", "-h"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("claimflow %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			if !strings.Contains(strings.ToLower(string(out)), "usage") && !strings.Contains(string(out), "-h") {
				t.Errorf("claimflow %s printed no usage:\n%s", strings.Join(args, " "), out)
			}
		})
	}
	out, err := exec.Command(bin, "no-such-command").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("an unknown command exited with %v, want status 2\n%s", err, out)
	}
}
