package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"

	"github.com/claimflow/claimflow/cmd/internal/services"
)

// runSimulator is `claimflow payoutsim` and `claimflow notifysim`: the
// simulators 'claimflow dev' runs in its own process, served on their own.
func runSimulator(ctx context.Context, log *slog.Logger, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	addr := fs.String("addr", fmt.Sprintf("127.0.0.1:%d", services.Simulators[cmd]), "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return services.RunSimulator(ctx, log, cmd, *addr)
}
