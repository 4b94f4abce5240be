package services

import "go.temporal.io/sdk/interceptor"

// crashInterceptors are the worker interceptors that inject crashes for the
// crash tests; none in a normal build (crash_crashtest.go sets them in a
// binary built with -tags crashtest).
var crashInterceptors = func() []interceptor.WorkerInterceptor { return nil }
