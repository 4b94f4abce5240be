package main

import (
	"time"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/cmd/internal/services"
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

// The issuer and audience the test stack requires (startTestStack).
const (
	testIssuer   = "claimflow-test-issuer"
	testAudience = "claimflow-test"
)

// mintToken signs a token for the test stack, with its issuer and audience.
func mintToken(secret, sub, role string, ttl time.Duration) (string, error) {
	return api.SignHS256(secret, sub, role, ttl, testIssuer, testAudience)
}
