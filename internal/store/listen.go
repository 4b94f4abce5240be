package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SettledChannel is the channel on which the enrollments_updated trigger
// (migration 00009_hot_confirm.sql) announces an enrollment that left
// 'reserved', with the enrollment's ID as the payload.
const SettledChannel = "enrollment_settled"

// ListenSettled holds one connection of its own (outside pool, with pool's
// settings) that LISTENs on SettledChannel, and calls settled with each
// payload, until ctx ends. Each time the connection is (re)established it
// calls connected, after LISTEN took effect: what was announced while no
// connection listened is lost, so the caller re-reads what it waits for.
// A lost connection is retried with a backoff of up to 5 s; each failure
// goes to failed.
func ListenSettled(ctx context.Context, pool *pgxpool.Pool, connected func(), settled func(id string), failed func(error)) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, func() {
			backoff = 100 * time.Millisecond
			connected()
		}, settled)
		if ctx.Err() != nil {
			return
		}
		failed(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, connected func(), settled func(id string)) error {
	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, err := pgx.ConnectConfig(connectCtx, pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return fmt.Errorf("connect the %s listener: %w", SettledChannel, err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+SettledChannel); err != nil {
		return fmt.Errorf("listen on %s: %w", SettledChannel, err)
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait on %s: %w", SettledChannel, err)
		}
		settled(n.Payload)
	}
}
