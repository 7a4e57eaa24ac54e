module qproxy.dev/accel-test-app

go 1.22
