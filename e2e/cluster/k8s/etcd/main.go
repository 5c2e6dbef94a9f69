// Command etcd is the etcd server, built at the version k8s.io/kubernetes itself requires
// (go.mod), so the API server gets the etcd it is tested with (Debian's 3.4 lacks watch
// progress requests, which the 1.36 API server's watch cache relies on).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
