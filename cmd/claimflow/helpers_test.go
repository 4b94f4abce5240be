package main

import (
	"time"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/internal/services"
)

// The integration tests drive the services package through these short
// names, the ones they had when the services lived in this command.
type (
	stack           = services.Stack
	stackOptions    = services.StackOptions
	consumerService = services.ConsumerService
)

var (
	startStack    = services.StartStack
	startAPI      = services.StartAPI
	startConsumer = services.StartConsumer
	newTelemetry  = services.NewTelemetry
)

// mintToken signs a token for the local stack with no issuer or audience.
func mintToken(secret, sub, role string, ttl time.Duration) (string, error) {
	return api.SignHS256(secret, sub, role, ttl, "", "")
}
