package main

import (
	"testing"

	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
)

// TestAPI runs the shared API table (package apptest) against this server.
func TestAPI(t *testing.T) { apptest.Run(t, wire) }

// TestWatchStream runs the shared watch-stream check against this server.
func TestWatchStream(t *testing.T) { apptest.RunWatch(t, wire) }
