// Command hello is the upstream application of bench/http.sh's proxy mode:
// it answers every request with "hello".
package main

import (
	"flag"
	"log"
	"net/http"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18099", "listen address")
	flag.Parse()
	hello := []byte("hello\n")
	log.Fatal(http.ListenAndServe(*listen, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(hello)
	})))
}
