package services

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/internal/config"
)

// NotifySink is the notification sink every process shares: the consumer
// delivers inline through it and the worker's DeliverEvent runs retry
// through it, so both must see the same NOTIFY_WEBHOOK_URL.
func NotifySink(cfg config.Config, pool *pgxpool.Pool) *consumer.Sink {
	return &consumer.Sink{DB: pool, WebhookURL: cfg.NotifyWebhookURL}
}

// ConsumerService is a running event consumer.
type ConsumerService struct {
	Consumer *consumer.Consumer
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned; err says why
	err      error
}

// StartConsumer consumes cfg.ConsumerTopics as cfg.ConsumerGroup until Stop.
func StartConsumer(cfg config.Config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *Telemetry) (*ConsumerService, error) {
	if err := cfg.RequireEventKey("the consumer"); err != nil {
		return nil, err
	}
	c, err := consumer.New(consumer.Config{
		EventKey: []byte(cfg.EventSigningKey),
		Kafka:    cfg.Kafka("claimflow-consumer"),
		Group:    cfg.ConsumerGroup,
		Topics:   cfg.ConsumerTopics,
		Sink:     NotifySink(cfg, pool),
		Temporal: tc,
		Log:      log.With("component", "consumer"),
		MaxBatch: cfg.ConsumerBatch,
		Metrics:  tel.Consumer,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &ConsumerService{Consumer: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = c.Run(ctx)
	}()
	log.Info("consumer started", "group", cfg.ConsumerGroup, "topics", cfg.ConsumerTopics,
		"webhook", cfg.NotifyWebhookURL)
	return s, nil
}

// Stop ends consumption: batches in flight finish (or stay uncommitted),
// then the consumer leaves its group so its partitions move at once.
func (s *ConsumerService) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

// RunConsumer is the `claimflow consumer` process: it consumes until ctx
// ends.
func RunConsumer(ctx context.Context, cfg config.Config, log *slog.Logger, migrate bool) error {
	if err := cfg.RequireEventKey("claimflow consumer"); err != nil {
		return err
	}
	if migrate {
		if err := Migrate(ctx, cfg, log); err != nil {
			return err
		}
	}
	conn, err := Connect(ctx, cfg, log, 32, cfg.MetricsAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	svc, err := StartConsumer(cfg, log, conn.Pool, conn.Temporal, conn.Telemetry)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-svc.done:
		return fmt.Errorf("consumer stopped: %w", svc.err)
	}
	log.Info("shutting down consumer")
	return svc.Stop()
}
