// Package layout holds no code: its test keeps the import rules of
// docs/architecture.md ("Who may import whom"), so a change that runs an
// import back up the layers fails go test instead of waiting for review.
package layout
