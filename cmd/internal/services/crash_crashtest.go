//go:build crashtest

package services

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
)

// In a binary built with -tags crashtest, CLAIMFLOW_CRASH_AFTER=<activity>
// kills this process (SIGKILL, its whole process group) the first time that
// activity returns without error: its effect is committed, and the workflow
// task or activity task that ran it never completes. The crash tests
// (cmd/claimflow/crash_test.go) hit the worst moment of a step this way
// every time, not by luck. It never exists in a normal build.
func init() {
	name := os.Getenv("CLAIMFLOW_CRASH_AFTER")
	if name == "" {
		return
	}
	crashInterceptors = func() []interceptor.WorkerInterceptor {
		return []interceptor.WorkerInterceptor{&crashAfter{name: name}}
	}
}

type crashAfter struct {
	interceptor.WorkerInterceptorBase
	name string
}

func (c *crashAfter) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	i := &crashActivity{name: c.name}
	i.Next = next
	return i
}

type crashActivity struct {
	interceptor.ActivityInboundInterceptorBase
	name string
}

func (c *crashActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	out, err := c.Next.ExecuteActivity(ctx, in)
	if err == nil && activity.GetInfo(ctx).ActivityType.Name == c.name {
		fmt.Fprintf(os.Stderr, "CLAIMFLOW_CRASH_AFTER: %s returned; killing process group %d\n", c.name, syscall.Getpgrp())
		_ = syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	return out, err
}
